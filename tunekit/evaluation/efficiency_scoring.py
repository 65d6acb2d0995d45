"""Scoring the strategies: medians over seeds and shapes, trials relative to random search, the issue's targets."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from tunekit.evaluation.efficiency_records import (
    ALL,
    FIRST_TOLERANCE,
    Aggregate,
    Ratio,
    Run,
    ShapeSummary,
    Stat,
    TableInfo,
    Target,
    find_aggregate,
    first_ratio_of,
    first_within,
    median_of,
    worst_of,
)

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
