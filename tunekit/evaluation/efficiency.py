"""The tuning-efficiency benchmark: how soon each search strategy finds a near-best config, on recorded devices.

Every strategy tunes every recorded timing table (tunekit.evaluation.timing_table) through the real tuner on a simulated
device (tunekit.evaluation.simulate), once per seed, and the search stops as soon as a measured config is within
`TOLERANCE` of the table's best. A run's cost is the trials it took (the heuristic default, always measured
first, is trial 1), the simulated device seconds, and the fraction of the space measured. A run that reaches
its trial cap first is censored: the numbers it reports are lower bounds, shown as ">N".

Per strategy and kernel, seeds are summarised per shape by their median, then shapes by their median and worst;
per device as well (one problem is recorded on several devices). Zero-trial quality: the share of shapes
whose first measured config (trial 1) is within 10% of the best.

The `model` strategy's learned ranking correction (tunekit.tuning.ranker) is fitted leave-one-shape-out: each
table is scored with a ranker fitted on every other table, so no table scores its own fit. `in_sample` fits one
on every table instead, for comparison.

In order below: the records (and their JSON), the simulated searches (in worker processes), the scoring (ratios to
random search, the targets), then `run_benchmark` and `format_table`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import multiprocessing
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch

from tunekit.core.errors import TunekitError
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
from tunekit.tuning.samplers import make_sampler

# ---------------------------------------------------------------------------------------------- records

TOLERANCE = 0.02  # "near-best": a recorded time <= (1 + TOLERANCE) x the table's best
FIRST_TOLERANCE = 0.10  # zero-trial quality: the first measured config within 10% of the table's best
ALL = "all"  # an aggregate over every kernel, or over every device


def near_best(time_ms: float, best_ms: float) -> bool:
    return time_ms <= best_ms * (1.0 + TOLERANCE)


@dataclass(frozen=True)
class Stat:
    """A summarised number; `censored`: some search behind it was cut off, so `value` is only a lower bound."""

    value: float
    censored: bool = False

    def show(self, fmt: str) -> str:
        return (">" if self.censored else "") + format(self.value, fmt)


def median_of(stats: Sequence[Stat]) -> Stat:
    """Median (mean of the middle two for an even count), exact only if no censored value sorts at or below it."""
    ordered = sorted(stats, key=lambda s: (s.value, s.censored))
    mid = len(ordered) // 2
    middle = ordered[mid - 1 : mid + 1] if len(ordered) % 2 == 0 else ordered[mid : mid + 1]
    # A censored value sorting above the middle is larger still in truth, so it cannot move the median.
    return Stat(sum(s.value for s in middle) / len(middle), any(s.censored for s in ordered[: mid + 1]))


def worst_of(stats: Sequence[Stat]) -> Stat:
    return Stat(max(s.value for s in stats), any(s.censored for s in stats))


@dataclass(frozen=True)
class TableInfo:
    name: str
    kernel: str
    problem: dict[str, Any]
    source_hash: str
    device: dict[str, Any]
    timer: str
    recorded: str
    n_configs: int
    best_ms: float | None  # None: no recorded config is correct
    best_config: dict[str, Any]
    heuristic_ms: float | None  # the heuristic default's recorded time; None when it did not run correctly
    problems: list[str]  # check_table's findings; a table with an error is not simulated
    near_best_configs: int = 0  # configs within TOLERANCE of the best

    @property
    def blind_random_trials(self) -> float | None:
        """Expected trials of a blind random search (uniform, without replacement, no heuristic first) until a
        near-best config: (n + 1) / (h + 1) for h near-best configs among n. Exact, no sampling."""
        if not self.near_best_configs:
            return None
        return (self.n_configs + 1) / (self.near_best_configs + 1)

    @property
    def device_name(self) -> str:
        return str(self.device.get("name", "unknown device"))

    @property
    def usable(self) -> bool:
        return not any(p.startswith("error") for p in self.problems)

    @property
    def needs_search(self) -> bool:
        """False when the heuristic default, always trial 1, is already near-best: every strategy scores 1 here."""
        return not (
            self.heuristic_ms is not None and self.best_ms is not None and near_best(self.heuristic_ms, self.best_ms)
        )


@dataclass(frozen=True)
class Run:
    table: str  # TableInfo.name
    strategy: str
    seed: int
    cap: int  # the trial budget it ran under
    reached: bool  # a config within TOLERANCE of the best was measured
    trials: int  # until that config; when not reached, every trial run (a lower bound)
    seconds: float  # simulated device seconds, likewise
    fraction: float  # trials / configs in the table
    asks: int  # configs the sampler proposed: the trials, plus invalid ones (pruned) and measured ones (reused)
    stop_reason: str
    wall_s: float  # real seconds on this machine, the sampler's own overhead included
    first_ratio: float | None = None  # trial 1's recorded time / the best; None: it did not run correctly


def first_ratio_of(runs: Sequence[Run]) -> float | None:
    """The median over seeds of trial 1's time / the best (a deterministic strategy's seeds all agree); a config
    that did not run correctly counts as infinitely slow, and a median that is so reads None."""
    if not runs:
        return None
    ratio = statistics.median(math.inf if r.first_ratio is None else r.first_ratio for r in runs)
    return None if math.isinf(ratio) else ratio


def first_within(ratio: float | None) -> bool:
    return ratio is not None and ratio <= 1.0 + FIRST_TOLERANCE


@dataclass(frozen=True)
class ShapeSummary:
    """One strategy on one table: the median over seeds."""

    table: str
    kernel: str
    strategy: str
    trials: Stat
    seconds: Stat
    fraction: Stat
    device: str = ALL  # TableInfo.device_name
    first_ratio: float | None = None  # first_ratio_of the runs


@dataclass(frozen=True)
class Aggregate:
    """One strategy on one kernel's tables (or all kernels'), on one device (or all): median and worst over shapes."""

    family: str
    strategy: str
    shapes: int
    trials_median: Stat
    trials_worst: Stat
    seconds_median: Stat
    seconds_worst: Stat
    fraction_median: Stat
    fraction_worst: Stat
    fewer_than_random: Ratio  # over every shape
    fewer_than_random_searched: Ratio  # over the shapes that need a search (TableInfo.needs_search)
    fewer_than_blind_random: Ratio  # blind random search's expected trials (TableInfo.blind_random_trials) / ours
    device: str = ALL
    first_within: float = 0.0  # the share of shapes whose first measured config is within FIRST_TOLERANCE


@dataclass(frozen=True)
class Ratio:
    """Median over shapes of random's trials / a strategy's trials (per shape, medians over seeds)."""

    value: float | None  # None: no shape had random runs
    shapes: int
    exact: bool = True  # False: a censored run entered it, so it could be higher or lower

    def show(self) -> str:
        return "-" if self.value is None else f"{'' if self.exact else '~'}{self.value:.2f}"


@dataclass(frozen=True)
class Target:
    description: str
    holds: bool | None  # None: cannot be judged from these tables
    measured: str


@dataclass
class Result:
    tables: list[TableInfo]
    runs: list[Run]
    shapes: list[ShapeSummary]
    aggregates: list[Aggregate]
    targets: list[Target]
    settings: dict[str, Any]
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        def stats(d: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
            return {**d, **{n: Stat(**d[n]) for n in names}}

        shape_stats = ("trials", "seconds", "fraction")
        aggregate_stats = [f"{m}_{k}" for m in shape_stats for k in ("median", "worst")]

        def aggregate(d: dict[str, Any]) -> Aggregate:
            names = ("fewer_than_random", "fewer_than_random_searched", "fewer_than_blind_random")
            ratios = {n: Ratio(**d[n]) for n in names}
            return Aggregate(**{**stats(d, aggregate_stats), **ratios})

        return cls(
            tables=[TableInfo(**t) for t in data["tables"]],
            runs=[Run(**r) for r in data["runs"]],
            shapes=[ShapeSummary(**stats(s, shape_stats)) for s in data["shapes"]],
            aggregates=[aggregate(a) for a in data["aggregates"]],
            targets=[Target(**t) for t in data["targets"]],
            settings=dict(data["settings"]),
            wall_s=float(data["wall_s"]),
            notes=list(data.get("notes", [])),
        )

    def aggregate(self, family: str, strategy: str, device: str = ALL) -> Aggregate | None:
        return find_aggregate(self.aggregates, family, strategy, device)


def find_aggregate(aggregates: Iterable[Aggregate], family: str, strategy: str, device: str = ALL) -> Aggregate | None:
    return next((a for a in aggregates if (a.family, a.strategy, a.device) == (family, strategy, device)), None)


# ---------------------------------------------------------------------------------------------- searches

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


# ---------------------------------------------------------------------------------------------- scoring

DEFAULT_STRATEGY = "model"  # the strategy the targets are about
GEMM_FAMILY = "gemm"
ALL_FAMILIES = ALL
# What the default strategy is expected to reach on every device (on leave-one-shape-out numbers).
TARGET_GEMM_FRACTION = 0.10
TARGET_GEMM_TRIALS = 10
TARGET_GEMM_WORST_FRACTION = 0.15
TARGET_WORST_FRACTION = 0.25
TARGET_FEWER_THAN_RANDOM = 3.0
TARGET_FIRST_WITHIN = 0.80


def summarise_shape(info: TableInfo, strategy: str, runs: Sequence[Run]) -> ShapeSummary:
    def stat(metric: str) -> Stat:
        return median_of([Stat(float(getattr(r, metric)), not r.reached) for r in runs])

    return ShapeSummary(
        info.name,
        info.kernel,
        strategy,
        stat("trials"),
        stat("seconds"),
        stat("fraction"),
        device=info.device_name,
        first_ratio=first_ratio_of(runs),
    )


def _ratio(pairs: Sequence[tuple[Stat, Stat]]) -> Ratio:
    """Median of random / strategy over (random's trials, the strategy's trials) pairs, one per shape."""
    ratios = [(r.value / t.value, r.censored or t.censored) for r, t in pairs if t.value > 0]
    if not ratios:
        return Ratio(None, 0)
    return Ratio(statistics.median(v for v, _ in ratios), len(ratios), not any(c for _, c in ratios))


def _aggregate(
    group: tuple[str, str, str],  # (family, device, strategy)
    shapes: Sequence[ShapeSummary],
    random_by_table: dict[str, Stat],
    searched: set[str],
    blind: dict[str, Stat],
) -> Aggregate:
    family, device, strategy = group
    pairs = [(random_by_table[s.table], s.trials, s.table in searched) for s in shapes if s.table in random_by_table]
    return Aggregate(
        family=family,
        strategy=strategy,
        shapes=len(shapes),
        trials_median=median_of([s.trials for s in shapes]),
        trials_worst=worst_of([s.trials for s in shapes]),
        seconds_median=median_of([s.seconds for s in shapes]),
        seconds_worst=worst_of([s.seconds for s in shapes]),
        fraction_median=median_of([s.fraction for s in shapes]),
        fraction_worst=worst_of([s.fraction for s in shapes]),
        fewer_than_random=_ratio([(r, t) for r, t, _ in pairs]),
        fewer_than_random_searched=_ratio([(r, t) for r, t, needs_search in pairs if needs_search]),
        fewer_than_blind_random=_ratio([(blind[s.table], s.trials) for s in shapes if s.table in blind]),
        device=device,
        first_within=sum(first_within(s.first_ratio) for s in shapes) / len(shapes),
    )


def aggregate_shapes(
    shapes: Sequence[ShapeSummary], strategies: Sequence[str], searched: set[str], blind: dict[str, Stat]
) -> list[Aggregate]:
    """Per device (each, then all), per kernel (each, then all), per strategy."""
    random_by_table = {s.table: s.trials for s in shapes if s.strategy == "random"}
    families = [*sorted({s.kernel for s in shapes}), ALL_FAMILIES]
    devices = [*sorted({s.device for s in shapes}), ALL]
    aggregates = []
    for device, family, strategy in itertools.product(devices, families, strategies):
        group = [
            s
            for s in shapes
            if s.strategy == strategy and family in (ALL_FAMILIES, s.kernel) and device in (ALL, s.device)
        ]
        if group:
            aggregates.append(_aggregate((family, device, strategy), group, random_by_table, searched, blind))
    return aggregates


def _at_most(stat: Stat | None, limit: float, fmt: str) -> tuple[bool | None, str]:
    if stat is None:
        return None, "no runs"
    # A censored value is a lower bound: above the limit it surely misses; at or below, nobody knows.
    holds = None if stat.censored and stat.value <= limit else stat.value <= limit
    return holds, stat.show(fmt)


def _at_least(ratio: Ratio | None, limit: float) -> tuple[bool | None, str]:
    if ratio is None or ratio.value is None:
        return None, "no runs"
    # an inexact ratio (a censored run entered it) could go either way
    return (ratio.value >= limit if ratio.exact else None), f"{ratio.show()}x over {ratio.shapes} shapes"


def judge_targets(result_aggregates: Sequence[Aggregate], fit: str = "") -> list[Target]:
    """The targets of the default strategy on each device; `fit` says how its ranker was fitted (for the reader)."""
    devices = sorted({a.device for a in result_aggregates if a.device != ALL}) or [ALL]
    return [t for device in devices for t in _device_targets(result_aggregates, device, fit)]


def _device_targets(result_aggregates: Sequence[Aggregate], device: str, fit: str) -> list[Target]:
    gemm = find_aggregate(result_aggregates, GEMM_FAMILY, DEFAULT_STRATEGY, device)
    every = find_aggregate(result_aggregates, ALL_FAMILIES, DEFAULT_STRATEGY, device)
    who = f"{DEFAULT_STRATEGY}{f' ({fit})' if fit else ''} on {device}"
    return [
        Target(
            f"{who}: median <= {TARGET_GEMM_FRACTION:.0%} of the space on GEMM shapes",
            *_at_most(gemm.fraction_median if gemm else None, TARGET_GEMM_FRACTION, ".1%"),
        ),
        Target(
            f"{who}: median <= {TARGET_GEMM_TRIALS} trials on GEMM shapes",
            *_at_most(gemm.trials_median if gemm else None, TARGET_GEMM_TRIALS, "g"),
        ),
        Target(
            f"{who}: <= {TARGET_GEMM_WORST_FRACTION:.0%} of the space on every GEMM shape (median over seeds)",
            *_at_most(gemm.fraction_worst if gemm else None, TARGET_GEMM_WORST_FRACTION, ".1%"),
        ),
        Target(
            f"{who}: <= {TARGET_WORST_FRACTION:.0%} of the space on every shape (median over seeds)",
            *_at_most(every.fraction_worst if every else None, TARGET_WORST_FRACTION, ".1%"),
        ),
        Target(
            f"{who}: >= {TARGET_FEWER_THAN_RANDOM:g}x fewer trials than a blind random search "
            "(median over every shape; expected trials (n+1)/(h+1))",
            *_at_least(every.fewer_than_blind_random if every else None, TARGET_FEWER_THAN_RANDOM),
        ),
        _random_target(every, who),
        _first_target(every, who),
    ]


def _random_target(every: Aggregate | None, who: str) -> Target:
    # Shapes where the heuristic default is already near-best score 1 trial for every strategy (the tuner measures
    # it first), so they cannot tell strategies apart: the ratio is judged on the shapes that need a search.
    description = (
        f"{who}: >= {TARGET_FEWER_THAN_RANDOM:g}x fewer trials than random "
        "(median over the shapes where the heuristic default is not already near-best)"
    )
    searched = every.fewer_than_random_searched if every else None
    holds, measured = _at_least(searched, TARGET_FEWER_THAN_RANDOM)
    if every is not None and searched is not None and searched.value is not None:
        measured += f" ({every.fewer_than_random.show()}x over all {every.fewer_than_random.shapes})"
    return Target(description, holds, measured)


def _first_target(every: Aggregate | None, who: str) -> Target:
    description = (
        f"{who}: the first measured config within {FIRST_TOLERANCE:.0%} of the best "
        f"on >= {TARGET_FIRST_WITHIN:.0%} of shapes"
    )
    if every is None:
        return Target(description, None, "no runs")
    return Target(description, every.first_within >= TARGET_FIRST_WITHIN, show_first_within(every))


def show_first_within(aggregate: Aggregate) -> str:
    """The share of shapes whose first config is within FIRST_TOLERANCE of the best, and their count."""
    within = round(aggregate.first_within * aggregate.shapes)
    return f"{aggregate.first_within:.0%} ({within}/{aggregate.shapes})"


# ---------------------------------------------------------------------------------------------- the benchmark

STRATEGIES = ("random", "tpe", "gp", "exhaustive", MODEL_STRATEGY)
MODEL_FITS = {False: "leave-one-shape-out", True: "in-sample"}  # by `in_sample`
DEFAULT_SEEDS = 5


def run_benchmark(
    tables: Sequence[TimingTable],
    strategies: Sequence[str] = STRATEGIES,
    seeds: Sequence[int] | int = DEFAULT_SEEDS,
    out_path: Path | str | None = None,
    progress: Callable[[Run, int, int], object] | None = None,
    *,
    cost: CandidateCost | None = None,
    gp_trial_cap: int = GP_TRIAL_CAP,
    workers: int | None = None,
    in_sample: bool = False,
) -> Result:
    """Every strategy on every usable table, once per seed; `seeds` is a list or a count (0..n-1).

    The model strategy scores each table with a ranker fitted on every other table (leave-one-shape-out), or with
    `in_sample` on every table, itself included (for comparison). Runs spread over `workers` processes (default:
    one per CPU; 1 runs them here). The numbers do not depend on it: every run is deterministic.
    `progress(run, done, total)` hears each finished run. Writes the result as JSON to `out_path` when given.
    """
    started = time.perf_counter()
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    for strategy in strategies:
        make_sampler(strategy, 0)  # an unknown strategy, or gp without scipy, fails now rather than mid-way
    infos = [describe_table(t) for t in tables]
    names = [i.name for i in infos]
    if len(set(names)) != len(names):
        raise TunekitError("two timing tables are for the same kernel, problem and device")
    usable = [i for i, info in enumerate(infos) if info.usable]
    notes = [f"{i.name} not simulated: {'; '.join(i.problems)}" for i in infos if not i.usable]
    jobs = [(i, strategy, seed) for i in usable for strategy in strategies for seed in seed_list]
    workers = min(default_workers() if workers is None else workers, len(jobs))
    rankers = fit_model_rankers(tables, usable, in_sample) if MODEL_STRATEGY in strategies else {}
    options = {"cost": cost, "gp_trial_cap": gp_trial_cap, "rankers": rankers}
    runs = execute(jobs, tables, infos, options, workers, progress)
    shapes = []
    for i in usable:
        for strategy in strategies:
            per_seed = [r for r in runs if r.table == infos[i].name and r.strategy == strategy]
            shapes.append(summarise_shape(infos[i], strategy, per_seed))
    blind = {i.name: Stat(b, False) for i in infos if (b := i.blind_random_trials) is not None}
    aggregates = aggregate_shapes(shapes, strategies, {i.name for i in infos if i.needs_search}, blind)
    result = Result(
        tables=infos,
        runs=runs,
        shapes=shapes,
        aggregates=aggregates,
        targets=judge_targets(aggregates, MODEL_FITS[in_sample]),
        settings={
            "strategies": list(strategies),
            "seeds": seed_list,
            "tolerance": TOLERANCE,
            "first_tolerance": FIRST_TOLERANCE,
            "gp_trial_cap": gp_trial_cap,
            "workers": workers,
            "candidate_cost": asdict(cost or CandidateCost()),
            **_model_settings(strategies, in_sample, {infos[i].name: r for i, r in rankers.items()}),
        },
        wall_s=time.perf_counter() - started,
        notes=notes,
    )
    if out_path is not None:
        Path(out_path).write_text(json.dumps(result.to_json(), indent=1, allow_nan=False) + "\n")
    return result


def _model_settings(strategies: Sequence[str], in_sample: bool, rankers: dict[str, Ranker]) -> dict[str, Any]:
    """How the model strategy's rankers were fitted, and on which tables each (so no table scoring its own fit
    can go unnoticed)."""
    if MODEL_STRATEGY not in strategies:
        return {}
    return {
        "model_fit": MODEL_FITS[in_sample],
        "model_fitted_on": {table: list(ranker.fitted_on) for table, ranker in rankers.items()},
    }


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table with every column padded to its widest cell (readable as plain text too)."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _rows(result: Result) -> list[tuple[str, ...]]:
    # With one device, its rows are the all-devices rows: shown once, named by the device.
    single_device = len({a.device for a in result.aggregates if a.device != ALL}) == 1
    return [
        (
            a.device,
            a.family,
            a.strategy,
            str(a.shapes),
            a.trials_median.show("g"),
            a.trials_worst.show("g"),
            a.seconds_median.show(".1f"),
            a.seconds_worst.show(".1f"),
            a.fraction_median.show(".1%"),
            a.fraction_worst.show(".1%"),
            a.fewer_than_random.show(),
            f"{a.fewer_than_random_searched.show()} ({a.fewer_than_random_searched.shapes})",
            a.fewer_than_blind_random.show(),
            show_first_within(a),
        )
        for a in result.aggregates
        if not (single_device and a.device == ALL)
    ]


def _model_note(settings: dict[str, Any]) -> list[str]:
    fit = settings.get("model_fit")
    if fit is None:
        return []
    how = (
        "each table scored with a ranker fitted on every other table (of any device), never on itself"
        if fit == MODEL_FITS[False]
        else "one ranker per kernel fitted on every table, the scored one included (for comparison only)"
    )
    return [f"Model runs: {fit}: {how}."]


def format_table(result: Result) -> str:
    header = (
        "device",
        "kernel",
        "strategy",
        "shapes",
        "trials med",
        "trials worst",
        "sim s med",
        "sim s worst",
        "space med",
        "space worst",
        "x fewer than random",
        "x fewer, searched shapes",
        "x fewer than blind random",
        f"first <={result.settings.get('first_tolerance', FIRST_TOLERANCE):.0%}",
    )
    settings = result.settings
    lines = [
        f"Trials until a config within {settings['tolerance']:.0%} of the recorded best is measured "
        f"(heuristic = trial 1); per shape the median over {len(settings['seeds'])} seeds, then median and worst "
        f"over shapes. '>N': cut off at its trial cap (gp: {settings['gp_trial_cap']}, others: the space). "
        "Searched shapes: those where the heuristic default is not already near-best (elsewhere every strategy "
        "scores 1). Blind random: a random search without tunekit's heuristic first, its expected trials computed "
        "exactly as (n+1)/(h+1) for h near-best configs among n. First: the shapes whose first measured config "
        "(trial 1, median over seeds) is that close to the best.",
        *_model_note(settings),
        "",
        _markdown(header, _rows(result)),
        "",
        "Targets:",
    ]
    for t in result.targets:
        verdict = {True: "holds", False: "MISSED", None: "unknown"}[t.holds]
        lines.append(f"- [{verdict}] {t.description}: {t.measured}")
    lines += [f"- note: {n}" for n in result.notes]
    n_tables = len({s.table for s in result.shapes})
    lines.append(f"{len(result.runs)} runs on {n_tables} tables in {result.wall_s:.1f} s wall time")
    return "\n".join(lines)
