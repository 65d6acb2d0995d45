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

Here: a run and its rows. Checking then timing one implementation is tunekit.evaluation.checked_timing, the run's
rates tunekit.evaluation.reference_rates, the max-autotune baseline's child process tunekit.evaluation.max_autotune.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec, Outputs
    from tunekit.evaluation.runners import Runner
    from tunekit.evaluation.suite import Family
    from tunekit.tuning.bench import Timer

from tunekit.evaluation.checked_timing import check_then_time, error_note
from tunekit.evaluation.max_autotune import max_autotune_measurement
from tunekit.evaluation.names import COMPILED, EAGER, GRAPH, HEURISTIC, TUNEKIT
from tunekit.evaluation.reference_rates import copy_bandwidth_gbps, copy_measurement, launch_floor_ms, matmul_tflops
from tunekit.evaluation.results import (
    BenchOptions,
    BenchRun,
    Measurement,
    Row,
    roofline_ms,
    timing_method,
)

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
        measurements.append(Measurement(TUNEKIT, "failed", note=error_note(exc)))
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
    from tunekit.evaluation.runners import compiled_runner, eager_runner

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
            measurements.append(max_autotune_measurement(family, problem, method, ctx.options, ctx.interpreted))
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
        run.notes.append(f"launch floor not measured: {error_note(exc)}")
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
