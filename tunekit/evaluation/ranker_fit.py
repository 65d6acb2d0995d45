"""Fit the learned ranker (tunekit.tuning.ranker) on recorded timing tables, and write the shipped weights.

    python -m tunekit.evaluation.ranker_fit            # refit on the shipped tables, rewrite ranker_weights.json

The fit is a weighted ridge regression of log(measured / modelled) on the ranker's features, per table centred
(a table's absolute time is the model's business; the ranker only reorders configs within a problem). Weights
favour the fast configs, whose order is what a search needs: (best / time)^2, normalised so that every table
counts the same. The model's one fitted constant, the cost of a main-loop step, is chosen from a short grid by
how close the ranker's first pick comes to each training table's best.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tunekit.core.registry import get_spec
from tunekit.evaluation.simulate import check_table, heuristic_ms, table_name
from tunekit.evaluation.timing_table import TimingTable
from tunekit.tuning import perf_model
from tunekit.tuning.ranker import WEIGHTS_FILE, Ranker
from tunekit.tuning.roofline import arch_for

LOOP_STEP_GRID = (0.0, 200.0, 400.0, 800.0, 1600.0, 3200.0)  # SM clocks per main-loop step
RIDGE = 0.01  # per unit of (normalised) table weight: keeps rarely seen features near zero
WEIGHT_POWER = 4.0  # a config's weight is (best / time) ** WEIGHT_POWER: the order near the best is what counts


@dataclass(frozen=True)
class _Sample:
    """One table's usable configs: their feature rows, log(measured / modelled) and fit weights."""

    names: tuple[str, ...]
    features: list[dict[str, float]]
    residual: np.ndarray  # log(measured) - log(modelled)
    weight: np.ndarray
    times: np.ndarray  # measured ms
    log_modelled: np.ndarray
    matrices: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict, compare=False)


def usable(table: TimingTable) -> bool:
    return bool(table.ok_rows()) and not any(p.startswith("error") for p in check_table(table))


_SAMPLES: dict[tuple[str, str, str, float | None], _Sample | None] = {}  # a leave-one-out run refits many times


def _sample(table: TimingTable, loop_step_clk: float | None) -> _Sample | None:
    key = (table_name(table), table.source_hash, table.recorded, loop_step_clk)
    if key not in _SAMPLES:
        _SAMPLES[key] = _compute_sample(table, loop_step_clk)
    return _SAMPLES[key]


def _compute_sample(table: TimingTable, loop_step_clk: float | None) -> _Sample | None:
    rows = table.ok_rows()
    arch = arch_for(table.fingerprint.compute_capability)
    if loop_step_clk is not None:
        arch = replace(arch, loop_step_clk=loop_step_clk)
    configs = [r.config for r in rows]
    quantized = perf_model.quantize_all(table.kernel, configs, table.problem, table.device_limits, arch=arch)
    if quantized is None:
        return None
    keep = [i for i, q in enumerate(quantized) if math.isfinite(q.predicted_clk) and q.predicted_clk > 0]
    if len(keep) < 2:
        return None
    times = np.array([float(rows[i].time_ms or 0.0) for i in keep])
    log_modelled = np.log([quantized[i].predicted_clk for i in keep])
    weight = (times.min() / times) ** WEIGHT_POWER
    return _Sample(
        names=tuple(sorted({n for i in keep for n in perf_model.ranker_features(quantized[i], table.problem)})),
        features=[perf_model.ranker_features(quantized[i], table.problem) for i in keep],
        residual=np.log(times) - log_modelled,
        weight=weight / weight.sum(),
        times=times,
        log_modelled=log_modelled,
    )


def _matrix(sample: _Sample, names: Sequence[str]) -> np.ndarray:
    key = tuple(names)
    if key not in sample.matrices:  # nested leave-one-out fits ask for the same matrix many times
        sample.matrices[key] = np.array([[row.get(n, 0.0) for n in names] for row in sample.features])
    return sample.matrices[key]


def _solve(samples: Sequence[_Sample], names: Sequence[str]) -> np.ndarray:
    """Weighted ridge least squares on per-table centred features and residuals."""
    size = len(names)
    lhs, rhs = RIDGE * len(samples) * np.eye(size), np.zeros(size)
    for s in samples:
        x = _matrix(s, names)
        x = x - s.weight @ x  # centred: the table's own mean (its absolute speed) is not the ranker's
        y = s.residual - s.weight @ s.residual
        lhs += x.T @ (s.weight[:, None] * x)
        rhs += x.T @ (s.weight * y)
    return np.linalg.solve(lhs, rhs)


def _pick_ratio(sample: _Sample, names: Sequence[str], coef: np.ndarray) -> float:
    """The time of the config ranked first (modelled time corrected by `coef`) over the table's best."""
    score = sample.log_modelled + (_matrix(sample, names) @ coef if len(names) else 0.0)
    return float(sample.times[int(np.argmin(score))] / sample.times.min())


def _first_pick_loss(samples: Sequence[_Sample], names: Sequence[str], coef: np.ndarray) -> float:
    """Mean over tables of log(time of the ranker's first pick / the table's best)."""
    return sum(math.log(_pick_ratio(s, names, coef)) for s in samples) / len(samples)


def fit_ranker(kernel: str, tables: Sequence[TimingTable]) -> Ranker:
    """The ranker of `kernel` fitted on those of `tables` that are of that kernel and usable (identity if none).

    It is `confident` when, leave-one-shape-out within those tables, its first pick is within 10% of the best on
    more of them than the kernel's hand heuristic is: only then does the tuner measure its pick first and dispatch
    serve it untuned (otherwise the search keeps the uncorrected model and the heuristic).
    """
    mine = _usable_tables(kernel, tables)
    ranker = _fit(kernel, mine)
    if not ranker.weights:
        return ranker
    held_out, _, heuristic = first_pick_hits(kernel, mine, ranker)
    return replace(ranker, confident=held_out > heuristic)


def _usable_tables(kernel: str, tables: Sequence[TimingTable]) -> list[TimingTable]:
    return sorted((t for t in tables if t.kernel == kernel and usable(t)), key=table_name)


def first_pick_hits(kernel: str, tables: Sequence[TimingTable], ranker: Ranker) -> tuple[int, int, int]:
    """On how many of the kernel's usable tables the first pick is within 10% of the best: the ranker's fitted
    leave-one-shape-out (without the table's problem), `ranker` itself (fitted on them all: in-sample), and the
    hand heuristic's."""
    held_out = in_sample = heuristic = 0
    mine = _usable_tables(kernel, tables)
    for held in mine:
        others = [t for t in mine if t.problem != held.problem]
        held_out += _first_pick_ratio(held, _fit(kernel, others)) <= FIRST_PICK_WITHIN
        in_sample += _first_pick_ratio(held, ranker) <= FIRST_PICK_WITHIN
        heuristic += _heuristic_ratio(held) <= FIRST_PICK_WITHIN
    return held_out, in_sample, heuristic


FIRST_PICK_WITHIN = 1.10  # a first pick "within 10% of the best": the zero-trial measure


def _first_pick_ratio(table: TimingTable, ranker: Ranker) -> float:
    sample = _sample(table, ranker.loop_step_clk)
    if sample is None:
        return math.inf
    names = sorted(ranker.weights)
    return _pick_ratio(sample, names, np.array([ranker.weights[n] for n in names]))


def _heuristic_ratio(table: TimingTable) -> float:
    ms = heuristic_ms(table)
    return math.inf if not ms else float(ms / (table.best().time_ms or ms))


def _fit(kernel: str, mine: Sequence[TimingTable]) -> Ranker:
    fitted_on = tuple(table_name(t) for t in mine)
    if get_spec(kernel).model is None or not mine:
        return Ranker(kernel, {}, None, fitted_on)
    best: tuple[float, Ranker] | None = None
    for step in LOOP_STEP_GRID:
        samples = [s for s in (_sample(t, step) for t in mine) if s is not None]
        if not samples:
            continue
        names = sorted({n for s in samples for n in s.names})
        coef = _solve(samples, names)
        loss = _first_pick_loss(samples, names, coef)
        ranker = Ranker(kernel, {n: float(c) for n, c in zip(names, coef) if abs(c) > 1e-9}, step, fitted_on)
        if best is None or loss < best[0] - 1e-12:
            best = (loss, ranker)
    return best[1] if best is not None else Ranker(kernel, {}, None, fitted_on)


def write_shipped(tables: Sequence[TimingTable]) -> list[Ranker]:
    """Fit one ranker per kernel with tables and rewrite the shipped weights file."""
    rankers = [fit_ranker(kernel, tables) for kernel in sorted({t.kernel for t in tables})]
    rankers = [r for r in rankers if r.weights]
    document = {
        "about": "tunekit.tuning.ranker weights, fitted by `python -m tunekit.evaluation.ranker_fit` on the shipped "
        "timing tables (cache/timings/)",
        "rankers": [r.to_json() for r in rankers],
    }
    WEIGHTS_FILE.write_text(json.dumps(document, indent=1) + "\n")
    return rankers


def main() -> None:
    from tunekit.evaluation.timing_table import load_all
    from tunekit.store.shipped_data import shipped_table_files

    tables = load_all(shipped_table_files())
    for ranker in write_shipped(tables):
        held_out, in_sample, heuristic = first_pick_hits(ranker.kernel, tables, ranker)
        print(
            f"{ranker.kernel}: {len(ranker.weights)} weights, loop step {ranker.loop_step_clk}, "
            f"{len(ranker.fitted_on)} tables, confident: {ranker.confident}; first pick within 10% of the best on "
            f"{held_out} leave-one-shape-out, {in_sample} in-sample, {heuristic} by the heuristic"
        )


if __name__ == "__main__":
    main()
