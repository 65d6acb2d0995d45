"""torch's own implementation as a candidate: timed like a config after the search, its time kept with the entry.

Dispatch serves torch's op for a tuned problem whose best Triton config is not faster than torch measured in the
same run (tunekit.runtime.dispatch): after tuning, adding tunekit never makes a problem slower than torch. The
time is taken in the tuner's own process (torch's ops cannot hang or corrupt the context the way a candidate
kernel can) with the tuner's timer, on inputs made like the candidates' bench inputs.
"""

from __future__ import annotations

from tunekit.core import backend
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TORCH_CANDIDATE
from tunekit.tuning.bench import Timer

__all__ = ["candidate_time", "time_torch"]


def time_torch(spec: KernelSpec, problem: Problem, seed: int, timer: Timer) -> float | None:
    """torch's time for `problem` (the kernel's `torch_baseline`, on its `torch_timing_inputs`) with `timer`; None
    without a baseline, in the interpreter (its timings mean nothing and dispatch never serves torch there) or when
    torch fails."""
    baseline = spec.torch_baseline
    if baseline is None or backend.INTERPRETED:
        return None
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)
    if spec.torch_timing_inputs is not None:
        inputs = spec.torch_timing_inputs(inputs)
    try:
        return float(timer(lambda: baseline(inputs), dict(TORCH_CANDIDATE)))
    except RuntimeError:  # torch itself cannot run it (out of memory): nothing to compare with
        return None


def candidate_time(
    spec: KernelSpec, problem: Problem, seed: int, timer: Timer, supplied: object | None
) -> float | None:
    """torch's time for the tuner: from the caller's bench where one was supplied (a simulation or a test's; None
    unless it has `time_torch()`), else measured here."""
    if supplied is not None:
        timed = getattr(supplied, "time_torch", None)
        return None if timed is None else timed()
    return time_torch(spec, problem, seed, timer)
