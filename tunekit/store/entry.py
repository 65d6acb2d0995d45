"""A cache entry: the best config, its time, provenance and every measured trial. JSON in, JSON out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tunekit.core.space import Value, config_id
from tunekit.store.key import CacheKey

TrialStatus = Literal["ok", "wrong", "failed"]
TRIAL_STATUSES: tuple[str, ...] = ("ok", "wrong", "failed")


@dataclass(frozen=True)
class TrialRecord:
    config: dict[str, Value]
    status: TrialStatus
    time_ms: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"config": dict(self.config), "status": self.status, "time_ms": self.time_ms, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(dict(data["config"]), data["status"], data.get("time_ms"), data.get("error"))


@dataclass(frozen=True)
class Entry:
    key: CacheKey
    config: dict[str, Value]
    time_ms: float
    device: dict[str, Any]
    provenance: dict[str, Any]
    trials: tuple[TrialRecord, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key.to_json(),
            "best": {"config": dict(self.config), "time_ms": self.time_ms},
            "device": self.device,
            "provenance": self.provenance,
            "trials": [t.to_json() for t in self.trials],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        return cls(
            key=CacheKey.from_json(data["key"]),
            config=dict(data["best"]["config"]),
            time_ms=float(data["best"]["time_ms"]),
            device=dict(data["device"]),
            provenance=dict(data["provenance"]),
            trials=tuple(TrialRecord.from_json(t) for t in data.get("trials", [])),
        )


TORCH_MS = "torch_ms"  # provenance: torch's own op timed by the tuning run (tunekit.tuning.torch_candidate)
# provenance: why this entry made a model step slower, measured in the model (tunekit.evaluation.tune_model); dispatch
# then serves torch's op for it. It stays through re-tuning and merges until the entry is forgotten.
DEMOTED = "demoted"
# provenance: the problem timed under torch.compile (tunekit.tuning.inductor_candidate): {"kernel_ms": the entry's
# kernel as Inductor builds it, "inductor_ms": torch's op compiled}; under compile the kernel serves where it wins.
UNDER_COMPILE = "under_compile"


def demoted(entry: Entry, why: str) -> Entry:
    return replace(entry, provenance={**entry.provenance, DEMOTED: why})


def merge_entries(old: Entry, new: Entry) -> Entry:
    """Keep the faster best; keep every trial measured by either (the newer record wins per config), and the newer
    timing of torch's op (a run's last entry has it, the checkpoints stored during its search do not)."""
    if old.key != new.key:
        raise ValueError("merge_entries needs entries with the same key")
    trials: dict[Any, TrialRecord] = {config_id(t.config): t for t in old.trials}
    trials.update({config_id(t.config): t for t in new.trials})
    winner = new if _faster(new.time_ms, old.time_ms) else old
    provenance = dict(winner.provenance)
    for kept in (TORCH_MS, DEMOTED, UNDER_COMPILE):  # the newer record of each, from either side
        value = new.provenance.get(kept, old.provenance.get(kept))
        if value is not None:
            provenance[kept] = value
    return replace(winner, trials=tuple(trials.values()), provenance=provenance)


def _faster(a: float, b: float) -> bool:
    return math.isfinite(a) and (not math.isfinite(b) or a < b)
