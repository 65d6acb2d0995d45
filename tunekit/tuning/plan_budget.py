"""A wall-time budget for a whole plan (`tunekit tune --plan FILE --budget 60`), in two passes.

1. Cover: every problem, heaviest first, gets its first COVER_TRIALS configs measured (the model's picks, with
   torch's op timed as always), so no problem of the plan is left to torch because larger ones spent the time: in
   a model step of 8 tokens the small GEMMs are the whole step, and tuning them is most of what a decode step gains.
2. Deepen: the time left goes to searching further, in proportion to each problem's weight (below), heaviest first
   (a problem's stored trials count against its trial budget, so its search continues where the cover stopped).

A problem's expected work is its roofline floor, the larger of its FLOPs and its minimum bytes over a nominal device
(the kernel declaration's `flops` and `bytes_moved`). Where the plan's steps are known (tunekit.tune_model records
each step's problems), a problem weighs its expected work over its step's: every step counts the same, as a step's
speed is what a user measures, and an 8-token decode step's GEMMs weigh as much as a prefill step's. Without steps
(`tune --plan`), the expected work itself: the plan is one step. A share bounds a search (the tuner stops between
trials, and measures at least one config). What a visit costs past its share (the trial in flight, re-timing the
best, torch's timing, the store) is learned as the plan runs and kept back for every problem still to come, so the
plan ends near its budget. When the time left cannot pay for one more cover, the rest stay untuned (`unreached`):
dispatch serves them torch's op, as it does any untuned problem.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Sequence

from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.tuning.tune_types import TuneOptions

COVER_TRIALS = 2
# What a cover costs before any has finished here: two configs' compile and timing, torch's timing and the store
# took about 1.5 s a problem on an H200 from an empty Triton cache (tests/gpu/budget_vs_trials.py, RESULTS.md).
FIRST_COST_S = 1.5
# Kept back from the budget for what follows the last visit (the isolation worker's shutdown) and what the last
# visit costs past its estimate: without it, a 60 s budget ended 1.8 s late on an H200 (budget_vs_trials.py).
CLOSE_S = 1.0
# Relative weights only: a nominal device (about an H100's dense bf16 rate and memory bandwidth) and its launch floor.
_FLOPS_PER_S = 8e14
_BYTES_PER_S = 3e12
_LAUNCH_S = 5e-6


def expected_work(spec: KernelSpec, problem: Problem) -> float:
    """The problem's roofline floor on the nominal device, seconds (a weight, not a prediction)."""
    return max(spec.flops(problem) / _FLOPS_PER_S, spec.bytes_moved(problem) / _BYTES_PER_S) + _LAUNCH_S


def step_weights(work: Sequence[tuple[KernelSpec, Problem]], steps: Sequence[Collection[int]] = ()) -> list[float]:
    """Each problem's expected work over its step's, a step being the indices into `work` of its problems (the
    largest such share where several steps hold a problem; the problems of no step count as one more step)."""
    works = [expected_work(spec, problem) for spec, problem in work]
    groups = [set(step) for step in steps]
    groups.append({i for i in range(len(work)) if not any(i in g for g in groups)})
    totals = [sum(works[i] for i in g) for g in groups]
    return [max(w / t for g, t in zip(groups, totals) if i in g) for i, w in enumerate(works)]


class PlanBudget:
    """Orders a plan's problems by weight (expected work, per step where known) and spends the budget on them in
    two passes (module doc)."""

    def __init__(
        self,
        work: Sequence[tuple[KernelSpec, Problem]],
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        steps: Sequence[Collection[int]] = (),
        started: float | None = None,
    ) -> None:
        """`steps`: each step's problems as indices into `work`, when known; `started`: when the caller's tuning
        began on `clock` (its imports and plan reading count), else now."""
        if not seconds > 0:
            raise TunekitError(f"--budget must be a positive number of seconds, but got {seconds}")
        weights = step_weights(work, steps)
        weighted = sorted(((w, s, p) for w, (s, p) in zip(weights, work)), key=lambda w: -w[0])
        self.order: list[tuple[KernelSpec, Problem]] = [(s, p) for _, s, p in weighted]
        self._weights = [w for w, _, _ in weighted]
        self._clock = clock
        self._deadline = (clock() if started is None else started) + seconds - CLOSE_S
        self._covers: list[float] = []  # seconds each cover took
        self._overruns: list[float] = []  # seconds past its share, of each deepening visit that used all of it
        self.unreached: list[tuple[KernelSpec, Problem]] = []  # the problems the budget did not pay for

    def left(self) -> float:
        return self._deadline - self._clock()

    def cover_cost(self) -> float:
        """What covering one more problem is expected to cost."""
        return statistics.median(self._covers) if self._covers else FIRST_COST_S

    def overrun(self) -> float:
        """What a deepening visit is expected to cost past its share (its search's time limit)."""
        return statistics.median(self._overruns) if self._overruns else self.cover_cost()

    def share(self, index: int) -> float | None:
        """Seconds for deepening the search of the problem at `index` of `order`, asked when it starts: its part of
        the time left in proportion to its weight, less the visit's own overrun; None when nothing is left of it
        (the visit would cost more than its part; the part passes on to the problems after it)."""
        part = self.left() * self._weights[index] / sum(self._weights[index:])
        given = part - self.overrun()
        return given if given > 0 else None

    def runs(self, options: TuneOptions) -> Iterator[tuple[KernelSpec, Problem, TuneOptions]]:
        """Each visit in order, with `options` limited for it: the covers, then the deepening visits. The time from
        one yield to the next is that visit's cost."""
        # Compiled ahead on the host's cores (tunekit.tuning.precompile): a search of a few configs waits on their
        # compiles more than on their timings.
        options = dataclasses.replace(options, precompile_threads=options.precompile_threads or _host_threads())
        cover = dataclasses.replace(options, trials=min(options.trials, COVER_TRIALS))
        for index, (spec, problem) in enumerate(self.order):
            if self.left() < self.cover_cost():
                self.unreached = self.order[index:]
                return
            started = self._clock()
            yield spec, problem, cover
            self._covers.append(self._clock() - started)
        if options.trials <= COVER_TRIALS:
            return
        for index, (spec, problem) in enumerate(self.order):
            share = self.share(index)
            if share is None:
                continue
            started = self._clock()
            yield spec, problem, dataclasses.replace(options, timeout_s=share)
            elapsed = self._clock() - started
            if elapsed >= share:
                self._overruns.append(elapsed - share)


def _host_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan_runs(
    work: Sequence[tuple[KernelSpec, Problem]], options: TuneOptions, budget: PlanBudget | None
) -> Iterator[tuple[KernelSpec, Problem, TuneOptions]]:
    """A plan's problems as a tuning loop takes them: under `budget`'s passes, else as listed."""
    if budget is not None:
        return budget.runs(options)
    return ((spec, problem, options) for spec, problem in work)
