"""torch's own implementation as a candidate: timed like a config after the search, its time kept with the entry.

Dispatch serves torch's op for a tuned problem whose best Triton config is not faster than torch measured in the
same run (tunekit.runtime.dispatch): after tuning, adding tunekit never makes a problem slower than torch. The
time is taken in the tuner's own process (torch's ops cannot hang or corrupt the context the way a candidate
kernel can) with the tuner's timer, on inputs made like the candidates' bench inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tunekit.core import backend
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TORCH_MS
from tunekit.tuning.bench import Timer

__all__ = ["LAUNCH_BOUND_MS", "TORCH_CANDIDATE", "candidate_time", "time_torch", "torch_time"]

# A tuned entry under this much GPU time is bound by the host in eager use (a Triton-served eager call costs 12-28 us
# of host time on the H200 hosts: `tunekit bench-host`), so its GPU time alone does not show it beats torch there:
# dispatch serves it only where the tuner also timed torch, with host cost counted (tunekit.runtime.dispatch).
LAUNCH_BOUND_MS = 0.03

TORCH_CANDIDATE: Mapping[str, str] = MappingProxyType({"implementation": "torch"})  # what a timer is told it times


def time_torch(spec: KernelSpec, problem: Problem, seed: int, timer: Timer) -> float | None:
    """torch's time for `problem` (the kernel's `torch_baseline`) with `timer`; None without a baseline, in the
    interpreter (its timings mean nothing and dispatch never serves torch there) or when torch fails."""
    baseline = spec.torch_baseline
    if baseline is None or backend.INTERPRETED:
        return None
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)
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


def torch_time(entry_provenance: Mapping[str, Any]) -> float | None:
    """torch's time as an entry recorded it, or None."""
    value = entry_provenance.get(TORCH_MS)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None
