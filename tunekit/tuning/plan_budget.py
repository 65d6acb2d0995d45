"""A wall-time budget for a whole plan (`tunekit tune --plan FILE --budget 60`): the problems that can gain the most
go first, and each gets a share of the time left in proportion to its expected work.

A problem's expected work is its roofline floor, the larger of its FLOPs and its minimum bytes over a nominal
device (the kernel declaration's `flops` and `bytes_moved`): a model step's time, and so what tuning can gain in it,
is mostly its largest problems'. A share bounds a problem's search (the tuner stops between trials, and measures at
least one config); what a problem costs past its share (the trial in flight, re-timing its best, torch's timing,
the store) is learned as the plan runs and kept back for every problem still to come, so the plan ends near its
budget. Time a problem leaves unused goes to the ones after it. When the time left cannot pay for one more problem,
the rest are not tuned: dispatch serves them torch's op, as it does any untuned problem.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.tuning.tune_types import TuneOptions

# What a problem costs past its share before any has finished here: about one config's compile, its timing, torch's
# and the store on an H100 or H200 (the eleventh session's phases, tests/gpu/plan_tune_phases.py).
FIRST_OVERRUN_S = 0.5
# The least share given: a time limit must be positive, and the search measures one config whatever its limit.
_LEAST_SHARE_S = 1e-3
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
        self._given: dict[int, float] = {}
        self._overruns: list[float] = []  # seconds past its share, of each problem that used all of it
        self.unreached: list[tuple[KernelSpec, Problem]] = []  # the problems the budget did not pay for

    def overrun(self) -> float:
        """What a problem is expected to cost past its share (its search's time limit)."""
        return statistics.median(self._overruns) if self._overruns else FIRST_OVERRUN_S

    def share(self, index: int) -> float | None:
        """Seconds for the search of the problem at `index` of `order`, asked when it starts; None when the time
        left cannot pay for it: the plan's budget is spent, and this problem and the rest stay untuned."""
        left = self._deadline - self._clock()
        overrun = self.overrun()
        if left < overrun:
            return None
        to_come = len(self.order) - index  # this problem included: each still costs its overrun
        spendable = max(0.0, left - overrun * to_come)
        given = max(_LEAST_SHARE_S, spendable * self._weights[index] / sum(self._weights[index:]))
        self._given[index] = given
        return given

    def finished(self, index: int, elapsed_s: float) -> None:
        """The problem at `index` took `elapsed_s` in all: what it cost past a share it used up is learned."""
        given = self._given.get(index)
        if given is not None and elapsed_s >= given:
            self._overruns.append(elapsed_s - given)

    def runs(self, options: TuneOptions) -> Iterator[tuple[KernelSpec, Problem, TuneOptions]]:
        """Each problem in order with `options` limited to its share, until the budget is spent (the rest are then
        `unreached`). The time from one problem's yield to the next is that problem's cost."""
        for index, (spec, problem) in enumerate(self.order):
            share = self.share(index)
            if share is None:
                self.unreached = self.order[index:]
                return
            started = self._clock()
            yield spec, problem, dataclasses.replace(options, timeout_s=share)
            self.finished(index, self._clock() - started)


def plan_runs(
    work: Sequence[tuple[KernelSpec, Problem]], options: TuneOptions, budget: PlanBudget | None
) -> Iterator[tuple[KernelSpec, Problem, TuneOptions]]:
    """A plan's problems as a tuning loop takes them: under `budget`'s order and shares, else as listed."""
    if budget is not None:
        return budget.runs(options)
    return ((spec, problem, options) for spec, problem in work)
