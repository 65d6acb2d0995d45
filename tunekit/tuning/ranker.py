"""A small learned correction to the quantization model's ranking, fitted on recorded timing tables.

The model (tunekit.tuning.perf_model) predicts each config's time from its tiles, waves, occupancy and rooflines. What
it does not model (2-byte loads of unaligned rows, the staged copies, the split-K reduction, how skinny tiles and
deep pipelines behave, code generation) shows up as a config-dependent error. The ranker predicts that error:

    log(measured / modelled) ~ sum over features of weight x feature(config, problem, quantization)

and ranks by modelled time x exp(correction). The features are generic (no kernel's names are spelled here): the
config's variant, alone and on unaligned problems, log2 of each integer parameter, and the model's own quantities
(wave efficiency, padding, resident programs, the share of the roofline). Every one is relative to the device's
limits, so one fit serves every device whose limits the model reads.

The weights are data: fitted by `tunekit.evaluation.ranker_fit` on the shipped timing tables and stored beside this
module (ranker_weights.json). `tunekit efficiency` scores the ranker leave-one-shape-out: it refits without the table
it scores.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunekit.core.space import Config, Problem
from tunekit.kernels.common import VECTOR_BYTES, element_bytes

WEIGHTS_FILE = Path(__file__).with_name("ranker_weights.json")


@dataclass(frozen=True)
class Ranker:
    """Per-kernel correction: log(measured / modelled) = sum of weight x feature; fitted on `fitted_on` tables."""

    kernel: str
    weights: Mapping[str, float] = field(default_factory=dict)
    loop_step_clk: float | None = None  # the model's per-K-step cost as fitted; None: the architecture's default
    fitted_on: tuple[str, ...] = ()  # the names of the tables it was fitted on
    # Leave-one-shape-out on those tables, its first pick beat the hand heuristic's (tunekit.evaluation.ranker_fit):
    # only a confident ranker is used (else the model ranks uncorrected and the heuristic is measured first).
    confident: bool = False

    def correction(self, values: Mapping[str, float]) -> float:
        """The predicted log(measured / modelled) of a config whose features are `values`."""
        return sum(self.weights.get(name, 0.0) * value for name, value in values.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "weights": {name: round(weight, 6) for name, weight in sorted(self.weights.items())},
            "loop_step_clk": self.loop_step_clk,
            "fitted_on": list(self.fitted_on),
            "confident": self.confident,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ranker:
        step = data.get("loop_step_clk")
        return cls(
            str(data["kernel"]),
            {str(k): float(v) for k, v in dict(data["weights"]).items()},
            None if step is None else float(step),
            tuple(str(n) for n in data["fitted_on"]),
            bool(data.get("confident", False)),
        )


def unaligned(problem: Problem) -> bool:
    """Rows whose starts are not all 16-byte aligned: the GEMM's aligned16 flag, or a row kernel's width."""
    if "aligned16" in problem:
        return not bool(problem["aligned16"])
    cols, dtype = problem.get("cols"), problem.get("dtype")
    if isinstance(cols, int) and isinstance(dtype, str):
        return cols * element_bytes(dtype) % VECTOR_BYTES != 0
    return False


def features(
    config: Config,
    problem: Problem,
    *,
    wave_efficiency: float,
    padded_waste: float,
    programs_per_sm: int,
    roofline_share: float,
    tiles: Mapping[str, int],
) -> dict[str, float]:
    """A config's features on a problem (the quantities after `*` are the model's, tunekit.tuning.perf_model)."""
    values: dict[str, float] = {
        "log_wave_efficiency": math.log(max(wave_efficiency, 1e-3)),
        "padded_waste": padded_waste,
        "log_programs_per_sm": math.log2(max(programs_per_sm, 1)),
        "log_roofline_share": math.log(max(roofline_share, 1e-4)),
    }
    for dim, count in tiles.items():
        values[f"log2_tiles:{dim}"] = math.log2(max(count, 1))
    odd_rows = unaligned(problem)
    variant = config.get("variant")
    if isinstance(variant, str):
        values[f"variant={variant}"] = 1.0
        if odd_rows:
            values[f"variant={variant}:unaligned"] = 1.0
    for name, value in config.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            values[f"log2:{name}"] = math.log2(value)
            if odd_rows:
                values[f"log2:{name}:unaligned"] = math.log2(value)
    return values


@functools.cache
def _shipped() -> dict[str, Ranker]:
    try:
        document = json.loads(WEIGHTS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {r.kernel: r for r in (Ranker.from_json(item) for item in document.get("rankers", []))}


def shipped_ranker(kernel: str) -> Ranker | None:
    """The ranker shipped with tunekit for `kernel`, or None."""
    return _shipped().get(kernel)


def usable_ranker(ranker: Ranker | None) -> Ranker | None:
    """`ranker` where it is fitted and confident, else None (the model's uncorrected order and the heuristic)."""
    return ranker if ranker is not None and ranker.weights and ranker.confident else None
