"""The efficiency benchmark's searches: one strategy on one timing table until a near-best config, many in parallel."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import optuna
import torch

from tunekit.core.errors import TunekitError
from tunekit.evaluation.efficiency_records import Run, TableInfo, near_best
from tunekit.evaluation.ranker_fit import fit_ranker
from tunekit.evaluation.simulate import (
    CandidateCost,
    SimulatedClock,
    check_table,
    heuristic_ms,
    simulate_tune,
    table_name,
)
from tunekit.evaluation.timing_table import TimingTable
from tunekit.store.entry import TrialRecord
from tunekit.tuning.ranker import Ranker

# Optuna's GP sampler ignores pruned (invalid) proposals, so on a sparse valid set it asks ~15 times per trial before
# the tuner hands it an unseen config, at 20 ms to 1 s per ask. Measured on 2 CPU cores, one torch thread: a run
# to 30 trials takes ~8 s, to 50 ~22 s, to 100 40-65 s. Capped at 30 so that the whole benchmark stays within
# minutes; later hits are censored (">30"). The other strategies run up to the space size.
GP_TRIAL_CAP = 30
MODEL_STRATEGY = "model"  # the strategy that reads a ranker (tunekit.tuning.ranker)


def describe_table(table: TimingTable) -> TableInfo:
    """What run_once needs to know about a table: its best, its size, how many configs are near the best."""
    problems = check_table(table)
    try:
        best = table.best()
    except TunekitError:
        best_ms: float | None = None
        best_config: dict[str, Any] = {}
    else:
        best_ms, best_config = float(best.time_ms or 0.0), dict(best.config)
    return TableInfo(
        name=table_name(table),
        kernel=table.kernel,
        problem=dict(table.problem),
        source_hash=table.source_hash,
        device=dict(table.device),
        timer=table.timer,
        recorded=table.recorded,
        n_configs=len(table.rows),
        best_ms=best_ms,
        best_config=best_config,
        heuristic_ms=heuristic_ms(table),
        problems=problems,
        near_best_configs=0
        if best_ms is None
        else sum(1 for r in table.ok_rows() if near_best(r.time_ms or 0, best_ms)),
    )


def trial_cap(strategy: str, n_configs: int, gp_trial_cap: int | None = None) -> int:
    if strategy != "gp":
        return n_configs
    return min(n_configs, GP_TRIAL_CAP if gp_trial_cap is None else gp_trial_cap)


@dataclass
class _Progress:
    """What a search has reached so far, as its trials come in."""

    trials: int = 0
    seconds: float = 0.0
    reached: bool = False
    first_ratio: float | None = None


def run_once(
    table: TimingTable,
    info: TableInfo,
    strategy: str,
    seed: int,
    *,
    cost: CandidateCost | None = None,
    gp_trial_cap: int | None = None,
    ranker: Ranker | None = None,
) -> Run:
    """One simulated search, stopped at the first measured config within TOLERANCE of the table's best.

    `ranker` is the model strategy's ranking correction (None: the shipped one)."""
    if info.best_ms is None:
        raise TunekitError(f"{info.name} has no correct config to find")
    best_ms = info.best_ms
    cap = trial_cap(strategy, info.n_configs, gp_trial_cap)
    clock = SimulatedClock()
    progress = _Progress()

    def on_trial(record: TrialRecord, n: int) -> bool:
        row = table.row(record.config)
        time_ms = row.time_ms if row is not None and row.status == "ok" else None
        if n == 1 and time_ms is not None:
            progress.first_ratio = time_ms / best_ms  # zero-trial quality: what the tuner trusts before searching
        progress.trials, progress.seconds = n, clock()
        progress.reached = time_ms is not None and near_best(time_ms, best_ms)
        return progress.reached

    started = time.perf_counter()
    stop_reason, pruned, reused = "", 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="optuna")  # GP: "clip non-finite values"
        try:
            simulation = simulate_tune(
                table, strategy, seed, max_trials=cap, on_trial=on_trial, clock=clock, cost=cost, ranker=ranker
            )
        except TunekitError as exc:
            if progress.reached:
                raise
            stop_reason = str(exc)  # every config measured before the cap failed: a miss, not a crash
        else:
            report = simulation.report
            stop_reason, pruned, reused = report.stop_reason, report.pruned, report.reused
    return Run(
        table=info.name,
        strategy=strategy,
        seed=seed,
        cap=cap,
        reached=progress.reached,
        trials=progress.trials,
        seconds=progress.seconds,
        fraction=progress.trials / info.n_configs,
        asks=progress.trials + pruned + reused,
        stop_reason=stop_reason,
        wall_s=time.perf_counter() - started,
        first_ratio=progress.first_ratio,
    )


def fit_model_rankers(tables: Sequence[TimingTable], usable: Sequence[int], in_sample: bool) -> dict[int, Ranker]:
    """The model strategy's ranker per table index: fitted on every table of another shape, of any device (leave-
    one-shape-out: no table is scored by a ranker fitted on its problem, whichever device recorded it), or with
    `in_sample` one per kernel fitted on every table."""
    if in_sample:
        fitted = {kernel: fit_ranker(kernel, tables) for kernel in sorted({tables[i].kernel for i in usable})}
        return {i: fitted[tables[i].kernel] for i in usable}

    def other_shapes(i: int) -> list[TimingTable]:
        return [t for t in tables if (t.kernel, t.problem) != (tables[i].kernel, tables[i].problem)]

    return {i: fit_ranker(tables[i].kernel, other_shapes(i)) for i in usable}


@contextlib.contextmanager
def _single_threaded() -> Iterator[None]:
    """One torch thread: Optuna's GP is several times faster on its small matrices, and thread-count independent."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


Job = tuple[int, str, int]  # (table index, strategy, seed)
_worker_state: dict[str, Any] = {}


def _start_worker(tables: Sequence[TimingTable], infos: Sequence[TableInfo], options: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _worker_state.update(tables=tables, infos=infos, options=options)


def _job_options(options: dict[str, Any], index: int, strategy: str) -> dict[str, Any]:
    """run_once's keyword arguments for one job: the shared ones, and for the model strategy its table's ranker."""
    rankers = options.get("rankers") or {}
    shared = {k: v for k, v in options.items() if k != "rankers"}
    return {**shared, "ranker": rankers.get(index) if strategy == MODEL_STRATEGY else None}


def _run_job(job: Job) -> Run:
    index, strategy, seed = job
    state = _worker_state
    options = _job_options(state["options"], index, strategy)
    return run_once(state["tables"][index], state["infos"][index], strategy, seed, **options)


def execute(
    jobs: Sequence[Job],
    tables: Sequence[TimingTable],
    infos: Sequence[TableInfo],
    options: dict[str, Any],  # run_once's keyword arguments, but "rankers": the model's ranker per table index
    workers: int,
    progress: Callable[[Run, int, int], object] | None,
) -> list[Run]:
    """Run every job, in worker processes when `workers` > 1; the result is in job order either way."""
    runs: list[Run | None] = [None] * len(jobs)
    if workers <= 1:
        with _single_threaded():
            for i, (index, strategy, seed) in enumerate(jobs):
                job_options = _job_options(options, index, strategy)
                runs[i] = run = run_once(tables[index], infos[index], strategy, seed, **job_options)
                if progress is not None:
                    progress(run, i + 1, len(jobs))
        return [r for r in runs if r is not None]
    # spawn, not fork: a forked child of a process that has used OpenMP threads (torch) can deadlock.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, context, initializer=_start_worker, initargs=(tables, infos, options)) as pool:
        # The slow strategy first, so that no long gp run starts last and leaves the other workers idle.
        order = sorted(range(len(jobs)), key=lambda i: jobs[i][1] != "gp")
        futures = {pool.submit(_run_job, jobs[i]): i for i in order}
        for done, future in enumerate(as_completed(futures), 1):
            runs[futures[future]] = run = future.result()
            if progress is not None:
                progress(run, done, len(jobs))
    return [r for r in runs if r is not None]


def default_workers() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
