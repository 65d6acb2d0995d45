"""Tune every problem of a plan file into a store, in this process, through the loop `tunekit tune` runs here
(tunekit.tuning.plan_loop): what the model workflow and tunekit.tune_model run."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tunekit.core.errors import TunekitError
from tunekit.tuning.plan_loop import tune_in_turn

if TYPE_CHECKING:
    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec
    from tunekit.store.store import Store
    from tunekit.tuning.tune_types import TuneOptions


@dataclass
class TuneCounts:
    tuned: int = 0  # problems this run measured configs for
    skipped: int = 0  # problems the working cache already held to the trial budget
    unreached: list[str] = field(default_factory=list)  # problems the wall-time budget did not pay for (untuned)
    failed: list[str] = field(default_factory=list)  # "kernel problem: why", for problems whose tuning raised
    # Where each problem's seconds went ("kernel problem" -> tunekit.tuning.phases' phases), failed ones included.
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    def phase_totals(self) -> dict[str, float]:
        """Seconds per phase over the whole plan."""
        from tunekit.tuning.phases import PhaseTimes

        return PhaseTimes.summed(self.phases.values()).to_json()


def tune_plan(
    plan: Path,
    cache_dir: Path | None,
    trials: int,
    budget_s: float | None = None,
    early_stop: float | None = None,
    precompile_threads: int = 0,
    steps: Sequence[Collection[str]] = (),
) -> TuneCounts:
    """Tune every problem of `plan` into the store at `cache_dir` (None: the working cache), as `tunekit tune --plan`
    does here: one bench (one isolation worker on a GPU) for the whole plan, and with `budget_s` the plan's
    wall-time budget (tunekit.tuning.plan_budget) and its timer (tunekit.tuning.bench.budget_timer), with `early_stop`
    the model's stopping rule at that relative timing noise (TuneOptions.early_stop), with `precompile_threads`
    each problem's first configs compiled ahead on that many threads (tunekit.tuning.precompile), with `steps`
    (each step's plan lines) the budget's weights per step. A plan line refused when read (named with its line)
    and a problem whose tuning fails are counted as failed; the others are still tuned. The counts hold each
    problem's seconds by phase (tunekit.tuning.phases)."""
    started = time.monotonic()  # a budget counts from here: optuna's import and the plan's reading included
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.fleet.plans import read_plan_lines
    from tunekit.runtime.recorder import plan_line
    from tunekit.store.user_entries import is_user_kernel
    from tunekit.tuning.bench import budget_timer
    from tunekit.tuning.orchestrate import TuneOptions
    from tunekit.tuning.phases import PhaseTimes
    from tunekit.tuning.shared_bench import SharedBench

    options = TuneOptions(trials=trials, early_stop=early_stop, precompile_threads=precompile_threads)
    device = fingerprint()
    counts = TuneCounts()
    read = read_plan_lines(plan)
    counts.failed += read.refused  # a bad line is named; the others are still tuned
    for line in read.problems:
        if is_user_kernel(line.kernel):
            counts.failed.append(f"{line.where}: {line.kernel}: a user kernel (`tunekit tune --plan` tunes it)")
    work = [(get_spec(line.kernel), line.problem) for line in read.problems if not is_user_kernel(line.kernel)]
    where = {plan_line(line.kernel, line.problem): line.where for line in read.problems}
    lines = [plan_line(spec.name, problem) for spec, problem in work]
    step_indices = [{i for i, line in enumerate(lines) if line in members} for members in map(set, steps)]
    bench = SharedBench(budget_timer() if budget_s is not None else None)
    tuned: dict[str, bool] = {}  # by problem, whether its last visit measured (a budget visits some twice)

    def name_of(spec: KernelSpec, problem: Problem) -> str:
        return f"{spec.name} {spec.describe_problem(problem)}"

    def tune_one(spec: KernelSpec, problem: Problem, these: TuneOptions, store: Store) -> None:
        name, phases = name_of(spec, problem), PhaseTimes()
        try:
            _, report = bench.tune(spec, problem, device, these, store, phases=phases)
        finally:
            counts.phases[name] = PhaseTimes.summed([counts.phases.get(name, {}), phases.to_json()]).to_json()
        tuned[name] = tuned.get(name, False) or not report.skipped

    def failed(spec: KernelSpec, problem: Problem, exc: TunekitError) -> None:
        counts.failed.append(f"{where[plan_line(spec.name, problem)]}: {name_of(spec, problem)}: {exc}")

    run = tune_in_turn(
        work, options, bench, tune_one, failed, budget_s=budget_s, started=started, steps=step_indices,
        cache_dir=cache_dir,
    )  # fmt: skip
    counts.tuned = sum(tuned.values())
    counts.skipped = len(tuned) - counts.tuned
    counts.unreached = [name_of(spec, problem) for spec, problem in run.unreached]
    return counts
