"""The tuning-efficiency benchmark: how soon each search strategy finds a near-best config, on recorded devices.

Every strategy tunes every recorded timing table (tunekit.evaluation.timing_table) through the real tuner on a simulated
device (tunekit.evaluation.simulate), once per seed, and the search stops as soon as a measured config is within
`TOLERANCE` of the table's best. A run's cost is the trials it took (the heuristic default, always measured
first, is trial 1), the simulated device seconds, and the fraction of the space measured. A run that reaches
its trial cap first is censored: the numbers it reports are lower bounds, shown as ">N".

Per strategy and kernel, seeds are summarised per shape by their median, then shapes by their median and worst.
"""

from __future__ import annotations

import contextlib
import json
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
from tunekit.core.registry import get_spec
from tunekit.evaluation.simulate import CandidateCost, SimulatedClock, check_table, simulate_tune
from tunekit.evaluation.timing_table import TimingTable
from tunekit.store.entry import TrialRecord
from tunekit.tuning.samplers import make_sampler

__all__ = ["Result", "format_table", "run_benchmark"]

STRATEGIES = ("random", "tpe", "gp", "exhaustive", "model")
DEFAULT_SEEDS = 5
TOLERANCE = 0.02  # "near-best": a recorded time <= (1 + TOLERANCE) x the table's best
# Optuna's GP sampler ignores pruned (invalid) proposals, so on a sparse valid set it asks ~15 times per trial before
# the tuner hands it an unseen config, at 20 ms to 1 s per ask. Measured on 2 CPU cores, one torch thread: a run
# to 30 trials takes ~8 s, to 50 ~22 s, to 100 40-65 s. Capped at 30 so that the whole benchmark stays within
# minutes; later hits are censored (">30"). The other strategies run up to the space size.
GP_TRIAL_CAP = 30
DEFAULT_STRATEGY = "model"  # the strategy the targets are about
GEMM_FAMILY = "gemm"
ALL_FAMILIES = "all"
# What the default strategy is expected to reach (the issue "Search that knows the hardware").
TARGET_GEMM_FRACTION = 0.10
TARGET_GEMM_TRIALS = 25
TARGET_WORST_FRACTION = 0.25
TARGET_FEWER_THAN_RANDOM = 3.0


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


@dataclass(frozen=True)
class ShapeSummary:
    """One strategy on one table: the median over seeds."""

    table: str
    kernel: str
    strategy: str
    trials: Stat
    seconds: Stat
    fraction: Stat


@dataclass(frozen=True)
class Aggregate:
    """One strategy on one kernel's tables (or all of them): median and worst over shapes."""

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

    def aggregate(self, family: str, strategy: str) -> Aggregate | None:
        return next((a for a in self.aggregates if a.family == family and a.strategy == strategy), None)


def table_name(table: TimingTable) -> str:
    problem = ",".join(f"{k}={v}" for k, v in table.problem.items())
    return f"{table.kernel}[{problem}]"


def near_best(time_ms: float, best_ms: float) -> bool:
    return time_ms <= best_ms * (1.0 + TOLERANCE)


def _heuristic_ms(table: TimingTable) -> float | None:
    try:
        heuristic = get_spec(table.kernel).heuristic(table.problem, table.fingerprint)
    except Exception:  # check_table reports a kernel that cannot be loaded
        return None
    row = table.row(heuristic)
    return row.time_ms if row is not None and row.status == "ok" else None


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
        heuristic_ms=_heuristic_ms(table),
        problems=problems,
        near_best_configs=0
        if best_ms is None
        else sum(1 for r in table.ok_rows() if near_best(r.time_ms or 0, best_ms)),
    )


def trial_cap(strategy: str, n_configs: int, gp_trial_cap: int | None = None) -> int:
    if strategy != "gp":
        return n_configs
    return min(n_configs, GP_TRIAL_CAP if gp_trial_cap is None else gp_trial_cap)


def run_once(
    table: TimingTable,
    info: TableInfo,
    strategy: str,
    seed: int,
    *,
    cost: CandidateCost | None = None,
    gp_trial_cap: int | None = None,
) -> Run:
    """One simulated search, stopped at the first measured config within TOLERANCE of the table's best."""
    if info.best_ms is None:
        raise TunekitError(f"{info.name} has no correct config to find")
    best_ms = info.best_ms
    cap = trial_cap(strategy, info.n_configs, gp_trial_cap)
    clock = SimulatedClock()
    progress = {"trials": 0, "seconds": 0.0, "reached": False}

    def on_trial(record: TrialRecord, n: int) -> bool:
        row = table.row(record.config)
        reached = row is not None and row.status == "ok" and row.time_ms is not None and near_best(row.time_ms, best_ms)
        progress.update(trials=n, seconds=clock(), reached=reached)
        return reached

    started = time.perf_counter()
    stop_reason, pruned, reused = "", 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="optuna")  # GP: "clip non-finite values"
        try:
            simulation = simulate_tune(table, strategy, seed, max_trials=cap, on_trial=on_trial, clock=clock, cost=cost)
        except TunekitError as exc:
            if progress["reached"]:
                raise
            stop_reason = str(exc)  # every config measured before the cap failed: a miss, not a crash
        else:
            report = simulation.report
            stop_reason, pruned, reused = report.stop_reason, report.pruned, report.reused
    trials = int(progress["trials"])
    return Run(
        table=info.name,
        strategy=strategy,
        seed=seed,
        cap=cap,
        reached=bool(progress["reached"]),
        trials=trials,
        seconds=float(progress["seconds"]),
        fraction=trials / info.n_configs,
        asks=trials + pruned + reused,
        stop_reason=stop_reason,
        wall_s=time.perf_counter() - started,
    )


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


def _run_job(job: Job) -> Run:
    index, strategy, seed = job
    state = _worker_state
    return run_once(state["tables"][index], state["infos"][index], strategy, seed, **state["options"])


def _execute(
    jobs: Sequence[Job],
    tables: Sequence[TimingTable],
    infos: Sequence[TableInfo],
    options: dict[str, Any],  # run_once's keyword arguments
    workers: int,
    progress: Callable[[Run, int, int], object] | None,
) -> list[Run]:
    """Run every job, in worker processes when `workers` > 1; the result is in job order either way."""
    runs: list[Run | None] = [None] * len(jobs)
    if workers <= 1:
        with _single_threaded():
            for i, (index, strategy, seed) in enumerate(jobs):
                runs[i] = run = run_once(tables[index], infos[index], strategy, seed, **options)
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


def _summarise_shape(info: TableInfo, strategy: str, runs: Sequence[Run]) -> ShapeSummary:
    def stat(metric: str) -> Stat:
        return median_of([Stat(float(getattr(r, metric)), not r.reached) for r in runs])

    return ShapeSummary(info.name, info.kernel, strategy, stat("trials"), stat("seconds"), stat("fraction"))


def _ratio(pairs: Sequence[tuple[Stat, Stat]]) -> Ratio:
    """Median of random / strategy over (random's trials, the strategy's trials) pairs, one per shape."""
    ratios = [(r.value / t.value, r.censored or t.censored) for r, t in pairs if t.value > 0]
    if not ratios:
        return Ratio(None, 0)
    return Ratio(statistics.median(v for v, _ in ratios), len(ratios), not any(c for _, c in ratios))


def _aggregate(
    family: str,
    strategy: str,
    shapes: Sequence[ShapeSummary],
    random_by_table: dict[str, Stat],
    searched: set[str],
    blind: dict[str, Stat],
) -> Aggregate:
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
    )


def _aggregates(
    shapes: Sequence[ShapeSummary], strategies: Sequence[str], searched: set[str], blind: dict[str, Stat]
) -> list[Aggregate]:
    random_by_table = {s.table: s.trials for s in shapes if s.strategy == "random"}
    families = [*sorted({s.kernel for s in shapes}), ALL_FAMILIES]
    aggregates = []
    for family in families:
        for strategy in strategies:
            group = [s for s in shapes if s.strategy == strategy and family in (ALL_FAMILIES, s.kernel)]
            if group:
                aggregates.append(_aggregate(family, strategy, group, random_by_table, searched, blind))
    return aggregates


def _at_most(stat: Stat | None, limit: float, fmt: str) -> tuple[bool | None, str]:
    if stat is None:
        return None, "no runs"
    # A censored value is a lower bound: above the limit it surely misses; at or below, nobody knows.
    holds = None if stat.censored and stat.value <= limit else stat.value <= limit
    return holds, stat.show(fmt)


def _targets(result_aggregates: Sequence[Aggregate]) -> list[Target]:
    def find(family: str, strategy: str = DEFAULT_STRATEGY) -> Aggregate | None:
        return next((a for a in result_aggregates if a.family == family and a.strategy == strategy), None)

    gemm, every = find(GEMM_FAMILY), find(ALL_FAMILIES)
    targets = [
        Target(
            f"{DEFAULT_STRATEGY}: median <= {TARGET_GEMM_FRACTION:.0%} of the space on GEMM shapes",
            *_at_most(gemm.fraction_median if gemm else None, TARGET_GEMM_FRACTION, ".1%"),
        ),
        Target(
            f"{DEFAULT_STRATEGY}: median <= {TARGET_GEMM_TRIALS} trials on GEMM shapes",
            *_at_most(gemm.trials_median if gemm else None, TARGET_GEMM_TRIALS, "g"),
        ),
        Target(
            f"{DEFAULT_STRATEGY}: <= {TARGET_WORST_FRACTION:.0%} of the space on every shape (median over seeds)",
            *_at_most(every.fraction_worst if every else None, TARGET_WORST_FRACTION, ".1%"),
        ),
    ]
    # Shapes where the heuristic default is already near-best score 1 trial for every strategy (the tuner measures
    # it first), so they cannot tell strategies apart: the ratio is judged on the shapes that need a search.
    description = (
        f"{DEFAULT_STRATEGY}: >= {TARGET_FEWER_THAN_RANDOM:g}x fewer trials than random "
        "(median over the shapes where the heuristic default is not already near-best)"
    )
    blind = every.fewer_than_blind_random if every else None
    blind_description = (
        f"{DEFAULT_STRATEGY}: >= {TARGET_FEWER_THAN_RANDOM:g}x fewer trials than a blind random search "
        "(median over every shape; expected trials (n+1)/(h+1))"
    )
    if blind is None or blind.value is None:
        targets.append(Target(blind_description, None, "no runs"))
    else:
        holds_blind = blind.value >= TARGET_FEWER_THAN_RANDOM if blind.exact else None
        targets.append(Target(blind_description, holds_blind, f"{blind.show()}x over {blind.shapes} shapes"))
    searched = every.fewer_than_random_searched if every else None
    if every is None or searched is None or searched.value is None:
        targets.append(Target(description, None, "no runs"))
    else:
        # an inexact ratio (a censored run entered it) could go either way
        holds = searched.value >= TARGET_FEWER_THAN_RANDOM if searched.exact else None
        measured = (
            f"{searched.show()}x over {searched.shapes} shapes "
            f"({every.fewer_than_random.show()}x over all {every.fewer_than_random.shapes})"
        )
        targets.append(Target(description, holds, measured))
    return targets


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
) -> Result:
    """Every strategy on every usable table, once per seed; `seeds` is a list or a count (0..n-1).

    Runs spread over `workers` processes (default: one per CPU; 1 runs them here). The numbers do not depend on
    it: every run is deterministic. `progress(run, done, total)` hears each finished run. Writes the result as
    JSON to `out_path` when given.
    """
    started = time.perf_counter()
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    for strategy in strategies:
        make_sampler(strategy, 0)  # an unknown strategy, or gp without scipy, fails now rather than mid-way
    infos = [describe_table(t) for t in tables]
    names = [i.name for i in infos]
    if len(set(names)) != len(names):
        raise TunekitError("two timing tables are for the same kernel and problem")
    usable = [i for i, info in enumerate(infos) if info.usable]
    notes = [f"{i.name} not simulated: {'; '.join(i.problems)}" for i in infos if not i.usable]
    jobs = [(i, strategy, seed) for i in usable for strategy in strategies for seed in seed_list]
    workers = min(default_workers() if workers is None else workers, len(jobs))
    options = {"cost": cost, "gp_trial_cap": gp_trial_cap}
    runs = _execute(jobs, tables, infos, options, workers, progress)
    shapes = []
    for i in usable:
        for strategy in strategies:
            per_seed = [r for r in runs if r.table == infos[i].name and r.strategy == strategy]
            shapes.append(_summarise_shape(infos[i], strategy, per_seed))
    blind = {i.name: Stat(b, False) for i in infos if (b := i.blind_random_trials) is not None}
    aggregates = _aggregates(shapes, strategies, {i.name for i in infos if i.needs_search}, blind)
    result = Result(
        tables=infos,
        runs=runs,
        shapes=shapes,
        aggregates=aggregates,
        targets=_targets(aggregates),
        settings={
            "strategies": list(strategies),
            "seeds": seed_list,
            "tolerance": TOLERANCE,
            "gp_trial_cap": gp_trial_cap,
            "workers": workers,
            "candidate_cost": asdict(cost or CandidateCost()),
        },
        wall_s=time.perf_counter() - started,
        notes=notes,
    )
    if out_path is not None:
        Path(out_path).write_text(json.dumps(result.to_json(), indent=1, allow_nan=False) + "\n")
    return result


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table with every column padded to its widest cell (readable as plain text too)."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def format_table(result: Result) -> str:
    header = (
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
    )
    rows = [
        (
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
        )
        for a in result.aggregates
    ]
    settings = result.settings
    lines = [
        f"Trials until a config within {settings['tolerance']:.0%} of the recorded best is measured "
        f"(heuristic = trial 1); per shape the median over {len(settings['seeds'])} seeds, then median and worst "
        f"over shapes. '>N': cut off at its trial cap (gp: {settings['gp_trial_cap']}, others: the space). "
        "Searched shapes: those where the heuristic default is not already near-best (elsewhere every strategy "
        "scores 1). Blind random: a random search without tunekit's heuristic first, its expected trials computed "
        "exactly as (n+1)/(h+1) for h near-best configs among n.",
        "",
        _markdown(header, rows),
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
