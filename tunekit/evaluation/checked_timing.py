"""One implementation of a benchmark row checked, then timed: built and run once against the kernel's reference (a
wrong or failing one is never timed, and says why in the row's note), then timed with CUDA events or as a CUDA-graph
replay (tunekit.evaluation.report measures rows with it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tunekit.core.spec import KernelSpec, Outputs, Tolerance
    from tunekit.evaluation.runners import Runner
    from tunekit.tuning.bench import Timer

from tunekit.evaluation.names import EVENTS, GRAPH
from tunekit.evaluation.results import AUTOGRAD_NOTE, GRAPH_LAUNCHES, Measurement

MAX_NOTE = 300  # characters of an error kept in a row's note: one line of a table, not a traceback


def error_note(exc: BaseException) -> str:
    """The exception's class and first line: one table note, not a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:MAX_NOTE]


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


def time_run(run: Runner, method: str, timer: Timer) -> tuple[float, str, str]:
    """(ms, how it was timed, note). A graph that cannot be captured falls back to events, and says so."""
    from tunekit.evaluation.runners import AutogradRunner

    if method == GRAPH and isinstance(run, AutogradRunner):
        # Not even tried: autograd's backward runs off the capture stream, and the capture that failed on the
        # H200 could leave the context in error for everything measured after it.
        return timer(run, {}), EVENTS, AUTOGRAD_NOTE
    if method == GRAPH:
        try:
            return time_graphed(timer, run), GRAPH, ""
        except RuntimeError as exc:
            _after_failed_capture()
            return timer(run, {}), EVENTS, f"graph capture failed, timed with events: {error_note(exc)}"
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
        return Measurement(impl, "failed", note=error_note(exc))
    if wrong is not None:
        return Measurement(impl, "wrong", note=wrong)
    try:
        ms, timing, note = time_run(run, method, timer)
    except Exception as exc:
        return Measurement(impl, "failed", note=error_note(exc))
    return Measurement(impl, "ok", ms=float(ms), timing=timing, note=note)
