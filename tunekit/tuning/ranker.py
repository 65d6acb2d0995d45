"""A small learned correction to the quantization model's ranking, fitted on recorded timing tables.

STUB (being written): the API below is fixed; the fit is not yet implemented (an identity correction).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunekit.evaluation.timing_table import TimingTable


@dataclass(frozen=True)
class Ranker:
    """Per-kernel correction: log(measured / modelled) = sum of weight x feature; fitted on `fitted_on` tables."""

    kernel: str
    weights: Mapping[str, float] = field(default_factory=dict)
    loop_step_clk: float | None = None  # None: the architecture's default
    fitted_on: tuple[str, ...] = ()  # the names of the tables it was fitted on

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "weights": dict(self.weights),
            "loop_step_clk": self.loop_step_clk,
            "fitted_on": list(self.fitted_on),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ranker:
        return cls(str(data["kernel"]), dict(data["weights"]), data.get("loop_step_clk"), tuple(data["fitted_on"]))


def fit_ranker(kernel: str, tables: Sequence[TimingTable]) -> Ranker:
    """The ranker of `kernel` fitted on those of `tables` that are of that kernel (an identity one when none are)."""
    used = tuple(sorted(f"{t.kernel}{sorted(t.problem.items())}" for t in tables if t.kernel == kernel))
    return Ranker(kernel, {}, None, used)


def shipped_ranker(kernel: str) -> Ranker | None:
    """The ranker shipped with tunekit for `kernel`, or None."""
    return None
