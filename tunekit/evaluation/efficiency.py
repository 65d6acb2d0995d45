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

This module runs the benchmark and renders its table; its parts live beside it: `efficiency_records` (what is
recorded, and its JSON), `efficiency_runs` (the simulated searches and their worker processes),
`efficiency_scoring` (summaries, ratios to random search, the targets).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tunekit.core.errors import TunekitError
from tunekit.evaluation.efficiency_records import (
    ALL,
    FIRST_TOLERANCE,
    TOLERANCE,
    Ratio,
    Result,
    Run,
    Stat,
    median_of,
    worst_of,
)
from tunekit.evaluation.efficiency_runs import (
    GP_TRIAL_CAP,
    MODEL_STRATEGY,
    default_workers,
    describe_table,
    execute,
    fit_model_rankers,
    run_once,
)
from tunekit.evaluation.efficiency_scoring import aggregate_shapes, judge_targets, show_first_within, summarise_shape
from tunekit.evaluation.simulate import CandidateCost
from tunekit.evaluation.timing_table import TimingTable
from tunekit.tuning.ranker import Ranker
from tunekit.tuning.samplers import make_sampler

# Besides the entry points, the names that tests and tools read from here, wherever among the parts they are defined.
__all__ = [
    "TOLERANCE",
    "Ratio",
    "Result",
    "Stat",
    "describe_table",
    "format_table",
    "median_of",
    "run_benchmark",
    "run_once",
    "worst_of",
]

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
