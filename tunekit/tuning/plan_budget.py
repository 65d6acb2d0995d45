"""A wall-time budget for a whole plan (`tunekit tune --plan FILE --budget 60`): the problems that can gain the most
go first, and each gets a share of the time left in proportion to its expected work.

A problem's expected work is its roofline floor, the larger of its FLOPs and its minimum bytes over a nominal
device (the kernel declaration's `flops` and `bytes_moved`): a model step's time, and so what tuning can gain in it,
is mostly its largest problems'. A share is a per-problem time limit (the tuner stops between trials); time a problem
leaves unused goes to the ones after it. Every problem gets at least MIN_SHARE_S, so each is measured at least once,
and the per-problem trial budget still applies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec

MIN_SHARE_S = 1.0
# Relative weights only: a nominal device (about an H100's dense bf16 rate and memory bandwidth) and its launch floor.
_FLOPS_PER_S = 8e14
_BYTES_PER_S = 3e12
_LAUNCH_S = 5e-6


def expected_work(spec: KernelSpec, problem: Problem) -> float:
    """The problem's roofline floor on the nominal device, seconds (a weight, not a prediction)."""
    return max(spec.flops(problem) / _FLOPS_PER_S, spec.bytes_moved(problem) / _BYTES_PER_S) + _LAUNCH_S


class PlanBudget:
    """Orders a plan's problems by expected work and gives each a share of the time left."""

    def __init__(
        self,
        work: Sequence[tuple[KernelSpec, Problem]],
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not seconds > 0:
            raise TunekitError(f"--budget must be a positive number of seconds, but got {seconds}")
        weighted = sorted(((expected_work(s, p), s, p) for s, p in work), key=lambda w: -w[0])
        self.order: list[tuple[KernelSpec, Problem]] = [(s, p) for _, s, p in weighted]
        self._weights = [w for w, _, _ in weighted]
        self._clock = clock
        self._deadline = clock() + seconds

    def share(self, index: int) -> float:
        """Seconds for the problem at `index` of `order`, asked when it starts."""
        left = max(0.0, self._deadline - self._clock())
        remaining = sum(self._weights[index:])
        return max(MIN_SHARE_S, left * self._weights[index] / remaining)
