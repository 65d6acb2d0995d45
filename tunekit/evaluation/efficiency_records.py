"""The efficiency benchmark's records: tables, runs, their summaries (lower bounds marked as such) and the JSON."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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
