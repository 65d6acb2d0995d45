"""A plan's problems tuned one after another in this process: the one loop that `tunekit tune` (here, not through a
job queue) and plan tuning (tunekit.evaluation.plan_tuning, which tunekit.tune_model runs) share. One bench (one
isolation worker on a GPU) and one store for the whole plan; with a wall-time budget, its passes
(tunekit.tuning.plan_budget); a problem whose tuning fails is reported and the next one runs."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunekit.core.errors import TunekitError

if TYPE_CHECKING:
    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec
    from tunekit.store.store import Store
    from tunekit.tuning.shared_bench import SharedBench
    from tunekit.tuning.tune_types import TuneOptions

Work = Sequence[tuple["KernelSpec", "Problem"]]


@dataclass
class InTurn:
    """What `tune_in_turn` gives back: the problems the budget did not reach, and the store's directory."""

    unreached: list[tuple[KernelSpec, Problem]]
    cache: Path


def tune_in_turn(
    work: Work,
    options: TuneOptions,
    bench: SharedBench,
    tune_one: Callable[[KernelSpec, Problem, TuneOptions, Store], None],
    failed: Callable[[KernelSpec, Problem, TunekitError], None],
    *,
    budget_s: float | None = None,
    started: float | None = None,
    steps: Sequence[Collection[int]] = (),
    cache_dir: Path | None = None,
) -> InTurn:
    """Each problem of `work` through `tune_one(spec, problem, this visit's options, store)`, in the budget's order
    and passes where `budget_s` is given (counted from `started`, and weighted by `steps`: each step's problems as
    indices into `work`), else as listed; a TunekitError goes to `failed` and the next problem runs. Closes `bench`."""
    from tunekit.store.store import Store
    from tunekit.tuning.plan_budget import PlanBudget, plan_runs

    try:
        planned = PlanBudget(work, budget_s, steps=steps, started=started) if budget_s is not None else None
        with Store(cache_dir) as store:
            for spec, problem, these in plan_runs(work, options, planned):
                try:
                    tune_one(spec, problem, these, store)
                except TunekitError as exc:
                    failed(spec, problem, exc)
    finally:
        bench.close()
    return InTurn(planned.unreached if planned is not None else [], store.directory)
