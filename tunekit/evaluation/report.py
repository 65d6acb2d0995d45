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
from dataclasses import asdict, dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from rich.table import Table

    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec, Outputs, Tolerance
    from tunekit.evaluation.suite import Family, Runner, Target
    from tunekit.tuning.bench import Timer

FORMAT = "tunekit-bench"
SCHEMA = 1
SMALL_PROBLEM_BYTES = 16 << 20  # below this a kernel runs in a few µs: launch overhead, not bandwidth
GRAPH_LAUNCHES = 20
COPY_BYTES = 1 << 30
MATMUL_SIZE = 8192

# Implementation names (the JSON's `impl`); families add their own baselines (cuBLASLt, torch F.gelu).
TUNEKIT = "tunekit"
HEURISTIC = "heuristic"
EAGER = "torch"
COMPILED = "torch.compile"
MAX_AUTOTUNE = "max-autotune"
COPY = "copy"  # a device-to-device copy of the row's bytes, timed like the row (memory-bound rows)
# tunekit's ratios to the copy of the same bytes and to the roofline (the same names as the suite's targets).
COPY_RATIO = "tunekit/copy"
BOUND_RATIO = "tunekit/bound"

# How a row was timed.
EVENTS = "cuda-events"
GRAPH = "cuda-graph"
WALL = "interpreter-wall-clock"

_RESULT_PREFIX = "tunekit-bench-result: "
_MAX_NOTE = 300
AUTOGRAD_NOTE = "autograd backward: not captured in a CUDA graph, timed with events (launch overhead included)"


# ---------------------------------------------------------------------------------------------- pure arithmetic


def timing_method(bytes_moved: int, interpreted: bool, small_bytes: int = SMALL_PROBLEM_BYTES) -> str:
    """CUDA graphs for small problems on a GPU (launch-bound), CUDA events otherwise; wall-clock in the interpreter."""
    if interpreted:
        return WALL
    return GRAPH if bytes_moved < small_bytes else EVENTS


def roofline_ms(
    bound: str, bytes_moved: int, flops: int, copy_gbps: float | None, matmul_tflops: float | None
) -> float | None:
    """The fastest the problem could run: its minimum bytes at copy bandwidth, and for GEMMs also its flops at the
    measured matmul rate (whichever takes longer). None without the measured rates (the interpreter)."""
    if copy_gbps is None or copy_gbps <= 0:
        return None
    memory_ms = bytes_moved / (copy_gbps * 1e9) * 1e3
    if bound != "compute":
        return memory_ms
    if matmul_tflops is None or matmul_tflops <= 0:
        return None
    return max(memory_ms, flops / (matmul_tflops * 1e12) * 1e3)


# ---------------------------------------------------------------------------------------------- results


@dataclass
class Measurement:
    impl: str
    status: str = "ok"  # ok | wrong (failed the check, never timed) | failed | skipped | timeout
    ms: float | None = None
    timing: str = ""
    note: str = ""
    served_by: str | None = None  # tunekit: the dispatch layer that served the config
    config: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(**data)


@dataclass
class Row:
    family: str
    kernel: str
    label: str
    problem: dict[str, Any]
    bound: str  # memory | compute: the roofline it is held to
    bytes_moved: int
    flops: int
    timing: str  # cuda-events | cuda-graph (launch-bound) | interpreter-wall-clock
    roofline_ms: float | None
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def launch_bound(self) -> bool:
        return self.timing == GRAPH

    def get(self, impl: str) -> Measurement | None:
        return next((m for m in self.measurements if m.impl == impl), None)

    def ms(self, impl: str) -> float | None:
        m = self.get(impl)
        return m.ms if m is not None and m.status == "ok" else None

    def throughput(self, impl: str) -> float | None:
        """GB/s (memory-bound) or TFLOP/s (compute-bound); None for launch-bound and interpreter rows."""
        ms = self.ms(impl)
        return None if ms is None else self.throughput_at(ms)

    def throughput_at(self, ms: float) -> float | None:
        if self.timing != EVENTS or ms <= 0:
            return None
        if self.bound == "compute":
            return self.flops / (ms * 1e-3) / 1e12
        return self.bytes_moved / (ms * 1e-3) / 1e9

    def speedup(self, impl: str, over: str) -> float | None:
        """How many times faster `impl` ran than `over` (both from this row, this run, timed the same way: a CUDA
        graph replay and an events time of a launch-bound problem measure different things)."""
        mine, theirs = self.get(impl), self.get(over)
        if mine is None or theirs is None or mine.timing != theirs.timing:
            return None
        a, b = self.ms(impl), self.ms(over)
        return None if a is None or b is None or a <= 0 else b / a

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        fields = dict(data)
        fields["measurements"] = [Measurement.from_json(m) for m in data["measurements"]]
        return cls(**fields)


@dataclass
class BenchRun:
    device: str
    timer: str
    interpreted: bool
    torch_version: str
    triton_version: str
    copy_gbps: float | None = None
    matmul_tflops: float | None = None
    launch_floor_ms: float | None = None
    small_problem_bytes: int = SMALL_PROBLEM_BYTES
    graph_launches: int = GRAPH_LAUNCHES
    notes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The run, and its summary for readers of the JSON (recomputed from the rows on load, never read back)."""
        return {"format": FORMAT, "schema": SCHEMA, **asdict(self), "summary": summarize(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchRun:
        if data.get("format") != FORMAT or data.get("schema") != SCHEMA:
            from tunekit.core.errors import TunekitError

            raise TunekitError(f"not a {FORMAT} schema {SCHEMA} file (format={data.get('format')!r})")
        fields = {k: v for k, v in data.items() if k not in ("format", "schema", "summary")}
        fields["rows"] = [Row.from_json(r) for r in data["rows"]]
        return cls(**fields)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False))

    @classmethod
    def load(cls, path: Path) -> BenchRun:
        return cls.from_json(json.loads(path.read_text()))


def read_run(path: Path) -> BenchRun:
    """BenchRun.load, any failure one TunekitError naming the file."""
    from tunekit.core.errors import TunekitError

    try:
        return BenchRun.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TunekitError(f"cannot read {path} as a `tunekit bench --json` file: {exc}") from None


@dataclass(frozen=True)
class BenchOptions:
    compile: bool | None = None  # torch.compile (default mode): on for a GPU, off in the interpreter
    max_autotune: bool = False  # torch.compile mode="max-autotune", in a child process killed after the limit
    compile_timeout_s: float = 300.0
    heuristic: bool = True  # also time the kernel's heuristic default config
    compile_backend: str = "inductor"  # tests pass "eager" to exercise the plumbing in seconds


# ---------------------------------------------------------------------------------------------- timing


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
    from tunekit.evaluation.suite import AutogradRunner

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
    from tunekit.evaluation.suite import empty_kernel

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
    from tunekit.evaluation.suite import compiled_runner, eager_runner

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
    from tunekit.evaluation.suite import SEED, compiled_runner, families, family_for
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


# ---------------------------------------------------------------------------------------------- tables


def _impls(rows: list[Row]) -> list[str]:
    """Implementations in the order measured; the copy last, next to the roofline it stands beside."""
    seen = list(dict.fromkeys(m.impl for r in rows for m in r.measurements))
    return [i for i in seen if i != COPY] + [i for i in seen if i == COPY]


def _baselines(impls: Iterable[str]) -> list[str]:
    """The implementations tunekit is compared with (vs X): neither tunekit's own nor the copy."""
    return [i for i in impls if i not in (TUNEKIT, HEURISTIC, COPY)]


def _cell(row: Row, impl: str) -> str:
    m = row.get(impl)
    if m is None:
        return ""
    if m.status != "ok" or m.ms is None:
        return {"wrong": "WRONG", "skipped": "n/a"}.get(m.status, m.status)
    if m.timing == WALL:
        return f"{m.ms:.2f} ms"
    if m.timing == GRAPH:
        return f"{m.ms * 1e3:.1f} µs"
    if row.launch_bound:  # not captured in a launch-bound row: its µs include the launch overhead
        return f"{m.ms * 1e3:.1f} µs (events)"
    value = row.throughput_at(m.ms)
    return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2f}"


def _ratio_cell(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def _bound_cell(row: Row, run: BenchRun) -> tuple[str, str]:
    """(the bound, tunekit as a fraction of it): roofline for throughput rows, launch floor for launch-bound rows."""
    ms = row.ms(TUNEKIT)
    if row.launch_bound:
        floor = run.launch_floor_ms
        if floor is None:
            return "-", "-"
        return f"floor {floor * 1e3:.1f} µs", f"{floor / ms:.2f}" if ms else "-"
    if row.roofline_ms is None:
        return "-", "-"
    best = row.throughput_at(row.roofline_ms)
    return (f"{best:.0f}" if best is not None else "-"), _ratio_cell(row_ratio(row, BOUND_RATIO))


def _check_cell(row: Row) -> str:
    bad = [f"{m.impl} {m.status}" for m in row.measurements if m.status in ("wrong", "failed", "timeout")]
    return "ok" if not bad else ", ".join(bad)


def _by_family(rows: Iterable[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row.family, []).append(row)
    return grouped


def tables(run: BenchRun) -> list[Table]:
    from rich.table import Table

    result = []
    for family, rows in _by_family(run.rows).items():
        impls = _impls(rows)
        baselines = _baselines(impls)
        with_copy = COPY in impls
        if run.interpreted:
            unit = "interpreter wall-clock, not GPU performance"
        else:
            unit = "TFLOP/s" if rows[0].bound == "compute" else "GB/s"
            unit += "; launch-bound rows (CUDA graphs): µs per call"
        table = Table(title=f"{family}: {unit}", title_justify="left")
        table.add_column("problem")
        table.add_column("served by")
        for impl in impls:
            table.add_column(impl, justify="right")
        if not run.interpreted:
            table.add_column("roofline", justify="right")
            if with_copy:
                table.add_column(COPY_RATIO, justify="right")
            table.add_column(BOUND_RATIO, justify="right")
            for impl in baselines:
                table.add_column(f"vs {impl}", justify="right")
        table.add_column("check")
        for row in rows:
            tunekit = row.get(TUNEKIT)
            cells = [row.label, (tunekit.served_by or "-") if tunekit else "-"]
            cells += [_cell(row, impl) for impl in impls]
            if not run.interpreted:
                roof, bound = _bound_cell(row, run)
                cells += [roof, _ratio_cell(row_ratio(row, COPY_RATIO)), bound] if with_copy else [roof, bound]
                cells += [_ratio_cell(row.speedup(TUNEKIT, impl), "x") for impl in baselines]
            cells.append(_check_cell(row))
            table.add_row(*cells)
        result.append(table)
    return result


def header(run: BenchRun) -> str:
    """Where and how the run was measured, and the rates and floor its ratios are against (one item a line)."""
    lines = [f"{run.device}, torch {run.torch_version}, triton {run.triton_version}, timer {run.timer}"]
    if run.copy_gbps is not None:
        lines.append(f"copy bandwidth {run.copy_gbps:.0f} GB/s (1 GiB device-to-device, read + write)")
    if run.matmul_tflops is not None:
        lines.append(f"bf16 matmul {run.matmul_tflops:.0f} TFLOP/s (torch.matmul {MATMUL_SIZE}³)")
    if run.launch_floor_ms is not None:
        what = "ms wall-clock" if run.interpreted else "µs (empty Triton kernel, CUDA graph)"
        scale = 1.0 if run.interpreted else 1e3
        lines.append(f"launch floor {run.launch_floor_ms * scale:.2f} {what}")
    if not run.interpreted:
        lines.append(
            "vs X: X's time / tunekit's (above 1: tunekit faster); tunekit/bound: the roofline's time (launch-bound "
            "rows: the launch floor's) / tunekit's"
        )
    if not run.interpreted and any(r.get(COPY) is not None for r in run.rows):
        lines.append(
            "copy: one device-to-device copy of the row's bytes, timed like the row (what a problem of this size "
            "can reach); tunekit/copy: its time / tunekit's"
        )
    return "\n".join(lines)


def notes(run: BenchRun) -> list[str]:
    """Run notes, then each distinct reason an implementation was not timed (with how many rows it hit)."""
    counted: dict[str, int] = {}
    for row in run.rows:
        for m in row.measurements:
            if m.note:
                key = f"{row.family} {m.impl} {m.status}: {m.note}"
                counted[key] = counted.get(key, 0) + 1
    return run.notes + [f"{k} ({n} rows)" if n > 1 else k for k, n in counted.items()]


# ---------------------------------------------------------------------------------------------- summary

SUMMARY_OVER = "rows timed with CUDA events (launch-bound rows left out)"


def row_ratio(row: Row, ratio: str) -> float | None:
    """tunekit's ratio on one row: to the copy of its bytes, to the roofline, or over a baseline ("vs X")."""
    if ratio == COPY_RATIO:
        return row.speedup(TUNEKIT, COPY)
    if ratio == BOUND_RATIO:
        ms = row.ms(TUNEKIT)
        return None if ms is None or ms <= 0 or row.roofline_ms is None else row.roofline_ms / ms
    return row.speedup(TUNEKIT, ratio.removeprefix("vs "))


def geomean(values: list[float]) -> float | None:
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _why_missing(row: Row, ratio: str) -> str:
    """Why a row has no value for `ratio`: the first of tunekit and the other side that was not measured."""
    other = {COPY_RATIO: COPY, BOUND_RATIO: None}.get(ratio, ratio.removeprefix("vs "))
    for impl in (TUNEKIT, other):
        if impl is None:
            return "no roofline"
        m = row.get(impl)
        if m is None:
            return f"{impl} not measured"
        if m.status != "ok":
            status = "n/a" if m.status == "skipped" else m.status
            return f"{impl} {status}: {m.note}" if m.note else f"{impl} {status}"
    return "timed differently"


def ratio_stats(rows: list[Row], ratio: str) -> dict[str, Any]:
    """The geomean of `ratio` over the rows that have it, how many those are, and why the others do not."""
    values: list[float] = []
    left_out: dict[str, int] = {}
    for row in rows:
        value = row_ratio(row, ratio)
        if value is not None and value > 0:
            values.append(value)
        else:
            why = _why_missing(row, ratio)
            left_out[why] = left_out.get(why, 0) + 1
    return {"geomean": geomean(values), "rows": len(values), "of": len(rows), "left_out": left_out}


def _groups(family: str, rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """(ALL, rows), then each of the family's groups (widths 2^k±1, GEMM size classes) with its rows."""
    from tunekit.evaluation.suite import ALL, families

    known = families().get(family)
    groups = [(ALL, rows)]
    for name, member in known.groups if known is not None else ():
        try:
            chosen = [r for r in rows if member(r.problem)]
        except (KeyError, TypeError, ValueError):  # a problem without the fields (a kernel outside the suite)
            chosen = []
        groups.append((name, chosen))
    return groups


def _summary_ratios(rows: list[Row]) -> list[str]:
    memory = [COPY_RATIO] if any(r.bound == "memory" for r in rows) else []
    return memory + [BOUND_RATIO] + [f"vs {impl}" for impl in _baselines(_impls(rows))]


def _judge(target: Target, stats: dict[str, Any], bound: dict[str, Any] | None) -> dict[str, Any]:
    value = stats["geomean"]
    judged: dict[str, Any] = {**asdict(target), "value": value, **{k: stats[k] for k in ("rows", "of", "left_out")}}
    judged["holds"] = value is not None and value >= target.minimum
    if bound is not None:  # "of copy bandwidth": the copy of the same bytes first, the 1 GiB roofline beside it
        judged[BOUND_RATIO] = bound["geomean"]
    return judged


def summarize(run: BenchRun) -> dict[str, Any] | None:
    """Per family and group, the geomean of every ratio over rows timed with CUDA events, and the issue's targets
    judged on them. None for an interpreter run (wall-clock claims no ratio)."""
    from tunekit.evaluation.suite import TARGETS

    if run.interpreted:
        return None
    measured = _by_family(r for r in run.rows if r.timing == EVENTS)
    present = {r.family for r in run.rows}
    geomeans, members = [], {}
    for family, rows in measured.items():
        for group, chosen in _groups(family, rows):
            members[family, group] = chosen
            ratios = {ratio: ratio_stats(chosen, ratio) for ratio in _summary_ratios(rows)}
            geomeans.append({"family": family, "group": group, "rows": len(chosen), "ratios": ratios})
    targets = []
    for target in TARGETS:
        if target.family in present:  # a family measured only launch-bound says so: "not measured"
            chosen = members.get((target.family, target.group), [])
            bound = ratio_stats(chosen, BOUND_RATIO) if target.ratio == COPY_RATIO else None
            targets.append(_judge(target, ratio_stats(chosen, target.ratio), bound))
    return {"over": SUMMARY_OVER, "geomeans": geomeans, "targets": targets}


def _format_ratio(ratio: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if ratio.startswith("vs ") else f"{value:.2f}"


def _left_out_text(left_out: dict[str, int]) -> str:
    return "; ".join(f"{n} {why}" for why, n in left_out.items())


def _rows_text(judged: dict[str, Any]) -> str:
    n, of = judged["rows"], judged["of"]
    text = f"{n} row{'s' if n != 1 else ''}" if n == of else f"{n} of {of} rows"
    return text + (f"; left out: {_left_out_text(judged['left_out'])}" if judged["left_out"] else "")


def target_line(judged: dict[str, Any]) -> str:
    """One target: what, the measured geomean, holds or missed by how much, and over which rows."""
    ratio, minimum, value = judged["ratio"], judged["minimum"], judged["value"]
    what = f"{judged['family']} [{judged['group']}] {ratio} >= {_format_ratio(ratio, minimum)}"
    if not judged["of"]:
        return f"{what}: not measured (no such rows timed with CUDA events in this run)"
    extra = [_rows_text(judged)]
    if judged.get(BOUND_RATIO) is not None:
        extra.insert(0, f"1 GiB roofline: {_format_ratio(BOUND_RATIO, judged[BOUND_RATIO])}")
    if value is None:
        return f"{what}: not measured ({'; '.join(extra)})"
    verdict = "holds" if judged["holds"] else f"missed by {_format_ratio(ratio, minimum - value)}"
    return f"{what}: {_format_ratio(ratio, value)} {verdict} ({'; '.join(extra)})"


def summary_table(summary: dict[str, Any]) -> Table:
    from rich.table import Table

    ratios = list(dict.fromkeys(r for g in summary["geomeans"] for r in g["ratios"]))
    table = Table(title=f"summary: geomeans over {summary['over']}", title_justify="left")
    for name in ("family", "rows", "n"):
        table.add_column(name)
    for ratio in ratios:
        table.add_column(ratio, justify="right")
    for g in summary["geomeans"]:
        cells = [g["family"], g["group"], str(g["rows"])]
        for ratio in ratios:
            s = g["ratios"].get(ratio)
            cell = "" if s is None else _format_ratio(ratio, s["geomean"])
            if s is not None and s["rows"] != s["of"]:
                cell += f" ({s['rows']}/{s['of']})"  # the others: n/a or not timed, said in the targets and notes
            cells.append(cell)
        table.add_row(*cells)
    return table


def print_summary(run: BenchRun, console: Console) -> None:
    summary = summarize(run)
    if summary is None:
        console.print("summary: none in the interpreter (wall-clock claims no ratio)", markup=False, highlight=False)
        return
    console.print(summary_table(summary))
    console.print(
        "targets (H200, fp16 and bf16; geomeans as above; 'of copy bandwidth' is tunekit/copy, the copy of the "
        "same bytes, with the 1 GiB roofline's tunekit/bound beside it):",
        markup=False,
        highlight=False,
    )
    for judged in summary["targets"]:
        console.print(f"  {target_line(judged)}", markup=False, highlight=False)


def print_report(run: BenchRun, console: Console) -> None:
    console.print(header(run), markup=False, highlight=False)
    for table in tables(run):
        console.print(table)
    for note in notes(run):
        console.print(f"note: {note}", markup=False, highlight=False)
    print_summary(run, console)


def print_saved_summary(run: BenchRun, console: Console) -> None:
    """`tunekit bench --summary F.json`: where the run was measured, then its summary, recomputed from the rows."""
    console.print(header(run), markup=False, highlight=False)
    print_summary(run, console)


def render(run: BenchRun, width: int = 200, summary_only: bool = False) -> str:
    """The whole report as plain text (what `tunekit bench` prints); `summary_only`: what `--summary` prints."""
    from rich.console import Console

    buffer = StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False)
    (print_saved_summary if summary_only else print_report)(run, console)
    return buffer.getvalue()
