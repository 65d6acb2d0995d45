"""Benchmark report: tunekit's dispatched kernels against torch eager, torch.compile, cuBLASLt and the roofline.

Method, for every row: one set of random inputs (the kernel's make_inputs, never zeros) shared by every
implementation; each implementation's output checked against the kernel's reference before it is timed (a wrong
one is never timed; tunekit's kernels at the kernel's tolerance, baselines at one scaled to the output, see
check_baseline); CUDA-event medians after warm-up with L2 flushed (triton.testing.do_bench). Every ratio is
against numbers measured in the same run: the copy bandwidth (1 GiB device-to-device, read + write), the bf16
matmul rate (torch.matmul 8192³) and the launch floor. Memory-bound rows also time a copy of their own bytes
("copy", timed like the row): the bandwidth a problem of that size can reach, where the 1 GiB rate is asymptotic.

Problems under SMALL_PROBLEM_BYTES are launch-bound: they are timed as CUDA-graph replays of GRAPH_LAUNCHES calls
(the graph replayed under do_bench, so L2 is flushed per replay, not per call) and reported in µs against the
launch floor, an empty Triton kernel timed the same way, never as bandwidth. In the interpreter every time is host
wall-clock, and no rate or roofline is claimed.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec, Outputs, Tolerance
    from tunekit.evaluation.suite import Family
    from tunekit.evaluation.suite_baselines import Runner
    from tunekit.tuning.bench import Timer

from tunekit.evaluation.names import COMPILED, COPY, EAGER, EVENTS, GRAPH, HEURISTIC, MAX_AUTOTUNE, TUNEKIT
from tunekit.evaluation.results import (
    AUTOGRAD_NOTE,
    COPY_BYTES,
    GRAPH_LAUNCHES,
    MATMUL_SIZE,
    BenchOptions,
    BenchRun,
    Measurement,
    Row,
    roofline_ms,
    timing_method,
)

# ---------------------------------------------------------------------------------------------- timing

_RESULT_PREFIX = "tunekit-bench-result: "
_MAX_NOTE = 300


def _why(exc: BaseException) -> str:
    """The exception's class and first line: one table note, not a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:_MAX_NOTE]


def time_graphed(timer: Timer, run: Runner, launches: int = GRAPH_LAUNCHES) -> float:
    """ms per call of `run`, from a CUDA graph of `launches` calls replayed under the timer (no launch overhead)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: lazy init (cuBLAS handles, workspaces) happens here
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            run()
    return timer(graph.replay, {}) / launches


def _after_failed_capture() -> None:
    """Raise what a failed capture left pending here, as the failing implementation's error, not at the next
    implementation's first launch; a context left in error raises here too (and every later row then fails)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(run: Runner, method: str, timer: Timer) -> tuple[float, str, str]:
    """(ms, how it was timed, note). A graph that cannot be captured falls back to events, and says so."""
    from tunekit.evaluation.suite_baselines import AutogradRunner

    if method == GRAPH and isinstance(run, AutogradRunner):
        # Not even tried: autograd's backward runs off the capture stream, and the capture that failed on the
        # H200 could leave the context in error for everything measured after it.
        return timer(run, {}), EVENTS, AUTOGRAD_NOTE
    if method == GRAPH:
        try:
            return time_graphed(timer, run), GRAPH, ""
        except RuntimeError as exc:
            _after_failed_capture()
            return timer(run, {}), EVENTS, f"graph capture failed, timed with events: {_why(exc)}"
    return timer(run, {}), method, ""


def _as_outputs(result: object) -> Outputs:
    import torch

    if isinstance(result, torch.Tensor):
        return (result,)
    if not isinstance(result, (tuple, list)):
        raise TypeError(f"an implementation returned {type(result).__name__}, not tensors")
    return tuple(result)


def baseline_tolerance(tol: Tolerance, reference: torch.Tensor) -> Tolerance:
    """The kernel's tolerance with atol widened to rtol * max|reference|: relative to the output's scale.

    A baseline is user code in the input dtype: torch eager rounds every intermediate (a @ b, + bias, gelu,
    + residual), so where the last ops cancel, one ulp of an intermediate of magnitude 4-8 (0.03 in bf16) is an
    absolute error on a near-zero output. Errors on the output's scale (a missing bias, zeros) still fail.
    """
    from tunekit.core.spec import Tolerance

    peak = float(reference.detach().abs().nan_to_num(0.0).max()) if reference.numel() else 0.0
    return Tolerance(max(tol.atol, tol.rtol * peak), tol.rtol)


def check_baseline(spec: KernelSpec, outputs: Outputs, expected: Outputs) -> str | None:
    """check_outputs with each floating output's tolerance scaled to that output (baseline_tolerance)."""
    from tunekit.tuning.verify import check_outputs

    return check_outputs(spec, outputs, expected, widen=baseline_tolerance)


def check_then_time(
    impl: str,
    build: Callable[[], Runner],
    spec: KernelSpec,
    expected: Outputs,
    method: str,
    timer: Timer,
    *,
    baseline: bool,
) -> Measurement:
    """Build, run once and check against the reference; time only what is correct. Errors become the row's note.

    `baseline`: torch and cuBLASLt code, checked by check_baseline; tunekit's kernels keep the kernel's tolerance.
    """
    from tunekit.tuning.verify import check_outputs

    check = check_baseline if baseline else check_outputs
    try:
        run = build()
        wrong = check(spec, _as_outputs(run()), expected)
    except Exception as exc:  # a baseline that cannot run (compile error, unsupported shape) is reported, not fatal
        return Measurement(impl, "failed", note=_why(exc))
    if wrong is not None:
        return Measurement(impl, "wrong", note=wrong)
    try:
        ms, timing, note = _time(run, method, timer)
    except Exception as exc:
        return Measurement(impl, "failed", note=_why(exc))
    return Measurement(impl, "ok", ms=float(ms), timing=timing, note=note)


def copy_runner(nbytes: int) -> Runner:
    """One device-to-device copy of `nbytes` (read + write: 2 * nbytes moved)."""
    import torch

    from tunekit.core import backend

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=backend.torch_device())
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_bandwidth_gbps(timer: Timer, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy, counting bytes read plus bytes written (the practical memory roofline)."""
    ms = timer(copy_runner(nbytes), {})
    return 2 * nbytes / (ms * 1e-3) / 1e9


def copy_measurement(bytes_moved: int, method: str, timer: Timer) -> Measurement:
    """A copy moving the row's bytes (half read, half written), timed like the row: what a problem of this size
    can reach. 32-64 MiB do not reach the 1 GiB copy's rate (launch, ramp-up and tail), not even as a copy."""
    try:
        ms, timing, note = _time(copy_runner(max(bytes_moved // 2, 1)), method, timer)
    except Exception as exc:  # e.g. out of memory: the row keeps its roofline ratio
        return Measurement(COPY, "failed", note=_why(exc))
    return Measurement(COPY, ms=float(ms), timing=timing, note=note)


def matmul_tflops(timer: Timer, size: int = MATMUL_SIZE) -> float:
    """The tensor-core roofline: torch.matmul of random bf16 size³ (cuBLAS), in TFLOP/s."""
    import torch

    from tunekit.core import backend

    device = backend.torch_device()
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: torch.matmul(a, b), {})
    return 2 * size**3 / (ms * 1e-3) / 1e12


def launch_floor_ms(timer: Timer, interpreted: bool) -> float:
    """An empty Triton kernel, timed as launch-bound problems are (CUDA graph; wall-clock in the interpreter)."""
    from tunekit.evaluation.suite_baselines import empty_kernel

    def run() -> None:
        empty_kernel[(1,)]()

    if interpreted:
        return timer(run, {})
    return time_graphed(timer, run)


# ---------------------------------------------------------------------------------------------- one row


@dataclass
class _Context:
    options: BenchOptions
    timer: Timer
    interpreted: bool
    copy_gbps: float | None
    matmul_tflops: float | None
    compile_enabled: bool


def kernel_runner(spec: KernelSpec, config: dict[str, Any], inputs: Any) -> Runner:
    """One launch of the kernel with this config into NaN-poisoned outputs (an unwritten element fails the check)."""
    from tunekit.tuning.verify import poison

    outputs = spec.alloc_outputs(inputs)
    for out in outputs:
        poison(out)

    def run() -> Outputs:
        spec.launch(config, inputs, outputs)
        return outputs

    return run


def _tunekit_measurements(
    spec: KernelSpec, problem: dict[str, Any], inputs: Any, expected: Outputs, method: str, ctx: _Context
) -> list[Measurement]:
    """The config tunekit.ops would dispatch to (cache, shipped, nearest or heuristic) and the heuristic default."""
    from tunekit.core.device import fingerprint
    from tunekit.core.errors import TunekitError
    from tunekit.runtime.dispatch import dispatcher

    d = dispatcher(spec.name)
    key = spec.problem_key(problem)
    configs: list[tuple[str, dict[str, Any]]] = []
    measurements = []
    try:
        configs.append((TUNEKIT, dict(d.config(key))))
    except TunekitError as exc:  # e.g. TUNEKIT_STRICT's cache miss
        measurements.append(Measurement(TUNEKIT, "failed", note=_why(exc)))
    if ctx.options.heuristic:
        configs.append((HEURISTIC, dict(spec.heuristic(problem, fingerprint()))))
    for impl, config in configs:
        build = functools.partial(kernel_runner, spec, config, inputs)
        m = check_then_time(impl, build, spec, expected, method, ctx.timer, baseline=False)
        m.config = config
        m.served_by = d.served_by.get(key) if impl == TUNEKIT else None
        measurements.append(m)
    return measurements


def _already(run: Runner) -> Callable[[], Runner]:
    return lambda: run


def _torch_measurements(
    family: Family,
    spec: KernelSpec,
    problem: dict[str, Any],
    inputs: Any,
    expected: Outputs,
    method: str,
    ctx: _Context,
) -> list[Measurement]:
    from tunekit.evaluation.suite_baselines import compiled_runner, eager_runner

    measurements = []
    program = family.torch_program
    if program is not None:
        eager = lambda: eager_runner(program(inputs))  # noqa: E731
        measurements.append(check_then_time(EAGER, eager, spec, expected, method, ctx.timer, baseline=True))
        if ctx.compile_enabled:
            backend = ctx.options.compile_backend
            build = lambda: compiled_runner(program(inputs), None, backend)  # noqa: E731
            measurements.append(check_then_time(COMPILED, build, spec, expected, method, ctx.timer, baseline=True))
        if ctx.options.max_autotune:
            measurements.append(_max_autotune(family, problem, method, ctx))
    for baseline in family.baselines:
        runner = baseline.build(inputs)
        if isinstance(runner, str):
            measurements.append(Measurement(baseline.name, "skipped", note=runner))
            continue
        built = _already(runner)
        measurements.append(check_then_time(baseline.name, built, spec, expected, method, ctx.timer, baseline=True))
    return measurements


def measure_row(family: Family, problem: Problem, ctx: _Context) -> Row:
    from tunekit.core import backend
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.suite import SEED

    spec = get_spec(family.kernel)
    inputs = family.adapt_inputs(spec.make_inputs(problem, backend.torch_device(), SEED))
    expected = spec.reference(inputs)
    bytes_moved, flops = spec.bytes_moved(problem), spec.flops(problem)
    method = timing_method(bytes_moved, ctx.interpreted)
    row = Row(
        family=family.name,
        kernel=family.kernel,
        label=family.label(problem),
        problem=dict(problem),
        bound=family.bound,
        bytes_moved=bytes_moved,
        flops=flops,
        timing=method,
        roofline_ms=roofline_ms(family.bound, bytes_moved, flops, ctx.copy_gbps, ctx.matmul_tflops),
    )
    row.measurements += _tunekit_measurements(spec, row.problem, inputs, expected, method, ctx)
    row.measurements += _torch_measurements(family, spec, row.problem, inputs, expected, method, ctx)
    if family.bound == "memory" and method != GRAPH:  # launch-bound rows are held to the launch floor instead
        row.measurements.append(copy_measurement(bytes_moved, method, ctx.timer))
    return row


# ---------------------------------------------------------------------------------------------- max-autotune


def _max_autotune(family: Family, problem: dict[str, Any], method: str, ctx: _Context) -> Measurement:
    """torch.compile max-autotune in a child process: its autotuning can run for many minutes on one shape, and only
    a process can be stopped at the time limit (its GPU work with it). It rebuilds the same inputs from the seed."""
    if ctx.interpreted and ctx.options.compile_backend == "inductor":
        return Measurement(MAX_AUTOTUNE, "skipped", note="max-autotune benchmarks Triton templates on a GPU")
    request = {
        "family": family.name,
        "kernel": family.kernel,
        "problem": problem,
        "method": method,
        "backend": ctx.options.compile_backend,
    }
    command = [sys.executable, "-c", "from tunekit.evaluation.report import max_autotune_child; max_autotune_child()"]
    limit = ctx.options.compile_timeout_s
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: inductor's compile workers die with it
    )
    try:
        out, err = proc.communicate(json.dumps(request), timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Measurement(MAX_AUTOTUNE, "timeout", note=f"compile + check + timing did not finish in {limit:g} s")
    for line in reversed(out.splitlines()):
        if line.startswith(_RESULT_PREFIX):
            return Measurement.from_json(json.loads(line[len(_RESULT_PREFIX) :]))
    tail = err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}"
    return Measurement(MAX_AUTOTUNE, "failed", note=f"child process: {tail}"[:_MAX_NOTE])


def max_autotune_child() -> None:
    """The child's side: one request on stdin, one result line on stdout."""
    from tunekit.core import backend
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.suite import SEED, families, family_for
    from tunekit.evaluation.suite_baselines import compiled_runner
    from tunekit.tuning.bench import default_timer

    request = json.loads(sys.stdin.read())
    family = families().get(request["family"]) or family_for(request["kernel"])
    spec = get_spec(family.kernel)
    inputs = family.adapt_inputs(spec.make_inputs(request["problem"], backend.torch_device(), SEED))
    program = family.torch_program
    assert program is not None
    build = lambda: compiled_runner(program(inputs), "max-autotune", request["backend"])  # noqa: E731
    expected = spec.reference(inputs)
    m = check_then_time(MAX_AUTOTUNE, build, spec, expected, request["method"], default_timer(), baseline=True)
    print(_RESULT_PREFIX + json.dumps(asdict(m)), flush=True)


# ---------------------------------------------------------------------------------------------- the run


def _cxx_compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _compile_decision(options: BenchOptions, interpreted: bool) -> tuple[bool, str]:
    """(run torch.compile?, why not). In the interpreter it is off unless asked for: inductor then compiles C++
    for the CPU (~15 s a shape on a small CI box), and CPU timings say nothing about a GPU anyway."""
    wanted = options.compile if options.compile is not None else not interpreted
    if not wanted:
        why = "off by default in the interpreter; --compile runs it on the CPU" if interpreted else "--no-compile"
        return False, f"torch.compile skipped: {why}"
    if interpreted and options.compile_backend == "inductor" and _cxx_compiler() is None:
        return False, "torch.compile skipped: inductor's CPU backend needs a C++ compiler and none was found"
    return True, ""


def start_run(
    families: Iterable[Family], options: BenchOptions, timer: Timer | None = None
) -> tuple[BenchRun, _Context]:
    """Measure this run's rates (copy bandwidth, matmul rate, launch floor) and set up the context of its rows."""
    import torch
    import triton

    from tunekit.core import backend
    from tunekit.core.device import fingerprint
    from tunekit.tuning.bench import default_timer

    timer = timer if timer is not None else default_timer()
    interpreted = backend.INTERPRETED
    run = BenchRun(fingerprint().label, timer.label, interpreted, torch.__version__, triton.__version__)
    if interpreted:
        run.notes.append(
            "interpreter: times are host wall-clock of Triton's interpreter on the CPU; they check the suite runs "
            "and every implementation agrees with the reference, and claim no bandwidth, FLOP rate or speedup"
        )
    else:
        run.copy_gbps = copy_bandwidth_gbps(timer)
        if any(f.bound == "compute" for f in families):
            run.matmul_tflops = matmul_tflops(timer)
    try:
        run.launch_floor_ms = launch_floor_ms(timer, interpreted)
    except Exception as exc:  # the floor is context for launch-bound rows, not a reason to stop the run
        run.notes.append(f"launch floor not measured: {_why(exc)}")
    compile_enabled, why = _compile_decision(options, interpreted)
    if why:
        run.notes.append(why)
    if options.max_autotune:
        run.notes.append(f"max-autotune: a child process per shape, stopped after {options.compile_timeout_s:g} s")
    ctx = _Context(options, timer, interpreted, run.copy_gbps, run.matmul_tflops, compile_enabled)
    return run, ctx


def run_bench(
    work: list[tuple[Family, Problem]],
    options: BenchOptions | None = None,
    timer: Timer | None = None,
    on_row: Callable[[BenchRun], None] | None = None,
) -> BenchRun:
    """Measure every (family, problem); `on_row` sees the run after each row (the CLI saves it: a killed run keeps
    what it has)."""
    options = options or BenchOptions()
    run, ctx = start_run([f for f, _ in work], options, timer)
    described = {f.name: f.note for f, _ in work if f.note}
    run.notes += [f"{name}: {note}" for name, note in described.items()]
    for family, problem in work:
        run.rows.append(measure_row(family, problem, ctx))
        if on_row is not None:
            on_row(run)
    return run


