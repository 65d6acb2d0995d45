"""A cache entry: the best config, its time, provenance and every measured trial. JSON in, JSON out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from tunekit.core.canonical import digest
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
# What a tuning run's timer is told it times when it times torch's op; dispatch serves it as the config meaning
# "run torch's own op".
TORCH_CANDIDATE: Mapping[str, str] = MappingProxyType({"implementation": "torch"})
# A tuned entry under this much GPU time is bound by the host in eager use (a Triton-served eager call costs 12-28 us
# of host time on the H200 hosts: `tunekit bench-host`), so its GPU time alone does not show it beats torch there:
# dispatch serves it only where the tuner also timed torch, with host cost counted (tunekit.runtime.dispatch).
LAUNCH_BOUND_MS = 0.03
# Under this much GPU time the tuner's timer also takes a call's per-call floor, calls made back to back through
# the served path (tunekit.tuning.bench): there an entry's time and torch's are host times, noisier than CUDA
# events (on the H200 host, RMSNorm's fp16 and bf16 problems of one shape floored up to 1.6x apart:
# tests/gpu/retime_torch.py), and tunekit's path is torch's launch plus Python; dispatch serves such an entry's
# kernel only where torch took HOST_FLOOR_MARGIN times as long (as the bucket layer asks of its edges).
HOST_FLOOR_MS = 0.1
HOST_FLOOR_MARGIN = 1.10
# What the built-in GPU timer stamps on an entry (tunekit.tuning.bench.CudaEventTimer.label), and the stamps of its
# earlier methods: those timed a launch-bound candidate by its bare launch, without tunekit's per-call work, and
# (GEMM) torch with a scaling pass its commonest call does not make. Under HOST_FLOOR_MS such an entry's ranking
# of kernel and torch does not hold where a user's calls run it: dispatch serves it torch ("torch-launch-bound")
# until it is tuned or retimed again (tests/gpu/retime_torch.py).
GPU_TIMER = "cuda-events-median-l2-flushed, per-call floor through the hot path when launch-bound"
SUPERSEDED_TIMERS = frozenset(
    {"cuda-events-median-l2-flushed", "cuda-events-median-l2-flushed, per-call floor when launch-bound"}
)


def superseded_floor(entry: Entry) -> bool:
    """Whether `entry` is launch-bound (under HOST_FLOOR_MS) and was timed by an earlier method (SUPERSEDED_TIMERS):
    its ranking of kernel and torch does not hold where a user's calls run it."""
    return entry.time_ms < HOST_FLOOR_MS and entry.provenance.get("timer") in SUPERSEDED_TIMERS


# provenance: why this entry's best config made a model step slower, measured in the model (tunekit.evaluation.
# tune_model); dispatch then serves torch's op for the problem.
DEMOTED = "demoted"
# provenance: the demotion of the config this entry replaced (a faster best from an import or a new tune). A demotion
# is the problem's: dispatch serves torch's op until the model verifies the new best (`verified_in_model`).
HELD = "demotion_held"
# provenance: the digest of the best config tune_model verified in the model; it lifts a held or shipped demotion.
MODEL_VERIFIED = "model_verified"
IMPORTED = "imported_from"  # provenance: the file an entry was imported from (served after one check here)
# Set here only, never taken from an imported file: a file claiming them would vouch for itself.
LOCAL_MARKS = (MODEL_VERIFIED,)
# provenance: the problem timed under torch.compile (tunekit.tuning.inductor_candidate), as flat fields under this
# prefix: kernel_ms (the entry's kernel as Inductor builds it), inductor_ms (torch's op compiled), and model (why a
# compiled model step was slower with it: tunekit.evaluation.compile_verify); under compile the kernel serves where it
# wins. Written nested under the bare name before (a database refuses that: `under_compile_record` reads both).
UNDER_COMPILE = "under_compile"
# provenance: the problem timed inside a model's step (tunekit.evaluation.in_step), as flat fields (a database's
# provenance holds scalars only) under this prefix: step, kept (the serving kept: before, tuned or torch), calls and
# problems (decided together), noise (the control's spread), and ms_<serving> (ms per step run of those calls).
# What `show`, `explain` and `in-step` print beside the tuner's time (`in_step_record` reads them back).
IN_STEP = "in_step_"
# provenance: what a torch.compile graph runs for the problem's GEMM (tunekit.runtime.compiled_gemm), decided inside
# the compiled step (tunekit.evaluation.compiled_step), as flat fields under this prefix: kept ("choice": Inductor's
# candidate `choice`, or "torch": torch's GEMM, the default mode's), choice (the candidate as canonical JSON: its
# template's uid and parameters; it can only select among the candidates Inductor itself offers), step, noise (the
# control's spread), by ("gemm": its GEMMs ran faster with it; "step": the whole step did, where the host bounds it),
# and ms_<serving> (ms per step run of the problem's GEMMs under "choice" and "torch").
COMPILED = "compiled_"
BAD_STATUSES = ("wrong", "failed")


def _with_fields(entry: Entry, prefix: str, record: Mapping[str, Any]) -> Entry:
    """`entry` holding `record` as flat provenance fields under `prefix` ("ms": {serving: ms} as ms_<serving>),
    any earlier ones under it replaced."""
    provenance = {k: v for k, v in entry.provenance.items() if not k.startswith(prefix)}
    for name, value in record.items():
        if name == "ms":
            provenance.update({f"{prefix}ms_{serving}": round(float(ms), 6) for serving, ms in value.items()})
        else:
            provenance[prefix + name] = value
    return replace(entry, provenance=provenance)


def with_in_step(entry: Entry, record: dict[str, Any]) -> Entry:
    """`entry` holding `record` (step, kept, calls, problems, noise, ms: {serving: ms}) as its in-step fields, any
    earlier ones replaced."""
    return _with_fields(entry, IN_STEP, record)


def in_step_record(provenance: Mapping[str, Any]) -> dict[str, Any] | None:
    """The in-step fields of a provenance as one record ("ms" gathered per serving), or None when it has none."""
    fields = {k[len(IN_STEP) :]: v for k, v in provenance.items() if k.startswith(IN_STEP)}
    ms = {k[len("ms_") :]: v for k, v in fields.items() if k.startswith("ms_") and isinstance(v, (int, float))}
    if not ms:
        return None
    return {**{k: v for k, v in fields.items() if not k.startswith("ms_")}, "ms": ms}


def _is_under_compile(name: str) -> bool:
    return name == UNDER_COMPILE or name.startswith(UNDER_COMPILE + "_")


def under_compile_record(provenance: Mapping[str, Any]) -> dict[str, Any] | None:
    """The problem's times under torch.compile (kernel_ms, inductor_ms, model), or None where it has none."""
    nested = provenance.get(UNDER_COMPILE)
    if isinstance(nested, Mapping):
        return dict(nested)
    fields = {k[len(UNDER_COMPILE) + 1 :]: v for k, v in provenance.items() if k.startswith(UNDER_COMPILE + "_")}
    return fields or None


def _with_under_compile(provenance: Mapping[str, Any], record: Mapping[str, Any] | None) -> dict[str, Any]:
    flat = {k: v for k, v in provenance.items() if not _is_under_compile(k)}
    flat.update({f"{UNDER_COMPILE}_{name}": value for name, value in (record or {}).items()})
    return flat


def with_under_compile(entry: Entry, record: Mapping[str, Any]) -> Entry:
    """`entry` holding `record` (kernel_ms, inductor_ms, and model where a model step was slower) as its flat
    under-compile fields, any earlier ones replaced."""
    return replace(entry, provenance=_with_under_compile(entry.provenance, record))


def with_compiled(entry: Entry, record: Mapping[str, Any]) -> Entry:
    """`entry` holding `record` (kept, choice, step, noise, ms: {serving: ms}) as its compiled fields, any earlier
    ones replaced."""
    return _with_fields(entry, COMPILED, record)


def compiled_choice(entry: Entry) -> str | None:
    """The Inductor choice a compiled graph runs for the entry's GEMM, where the compiled step kept one."""
    choice = entry.provenance.get(COMPILED + "choice")
    kept = entry.provenance.get(COMPILED + "kept")
    return choice if kept == "choice" and isinstance(choice, str) and choice else None


def torch_time(entry_provenance: Mapping[str, Any]) -> float | None:
    """torch's time as an entry recorded it, or None."""
    value = entry_provenance.get(TORCH_MS)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def config_digest(config: dict[str, Value]) -> str:
    """A config's identity as text (what the verdict of a check on it is recorded under)."""
    return digest(sorted(config.items()))


def demoted(entry: Entry, why: str) -> Entry:
    provenance = {k: v for k, v in entry.provenance.items() if k not in (HELD, MODEL_VERIFIED)}
    return replace(entry, provenance={**provenance, DEMOTED: why})


def verified_in_model(entry: Entry) -> Entry:
    """`entry` as verified in the model (tune_model): a demotion held for its problem, or a shipped one, is lifted."""
    provenance = {k: v for k, v in entry.provenance.items() if k != HELD}
    return replace(entry, provenance={**provenance, MODEL_VERIFIED: config_digest(entry.config)})


def model_verified(entry: Entry) -> bool:
    return entry.provenance.get(MODEL_VERIFIED) == config_digest(entry.config)


def demotion(entry: Entry) -> str | None:
    """Why dispatch serves torch's op for the entry's problem: its best config's own demotion, or one it holds for
    the config it replaced (until the model verifies it); None when neither."""
    why = entry.provenance.get(DEMOTED)
    if why is None and not model_verified(entry):
        why = entry.provenance.get(HELD)
    return None if why is None else str(why)


def bad_record(entry: Entry, config: dict[str, Value] | None = None) -> TrialRecord | None:
    """The entry's own trial record marking `config` (default: its best) wrong or failed, or None."""
    wanted = config_id(entry.config if config is None else config)
    found = [t for t in entry.trials if config_id(t.config) == wanted]
    return found[-1] if found and found[-1].status in BAD_STATUSES else None


def merge_entries(old: Entry, new: Entry) -> Entry:
    """Keep the faster best whose config the merged trials do not mark wrong or failed; keep every trial measured by
    either (the newer record wins per config), and the newer timing of torch's op (a run's last entry has it, the
    checkpoints stored during its search do not).

    A demotion belongs to a config: the winner keeps its own, and either side's of the same config. A demotion of
    the config `old` held is kept with the problem (HELD: torch serves it until the model verifies the new best);
    one that comes with a losing `new` (an import, a checkpoint) is not moved onto the winner."""
    if old.key != new.key:
        raise ValueError("merge_entries needs entries with the same key")
    trials: dict[Any, TrialRecord] = {config_id(t.config): t for t in old.trials}
    trials.update({config_id(t.config): t for t in new.trials})

    def bad(entry: Entry) -> bool:
        record = trials.get(config_id(entry.config))
        return record is not None and record.status in BAD_STATUSES

    winner, loser = (new, old) if _faster(new.time_ms, old.time_ms) else (old, new)
    if bad(winner) and not bad(loser):
        winner, loser = loser, winner
    provenance = dict(winner.provenance)
    value = new.provenance.get(TORCH_MS, old.provenance.get(TORCH_MS))  # the newer timing, from either side
    if value is not None:
        provenance[TORCH_MS] = value
    under_compile = under_compile_record(new.provenance) or under_compile_record(old.provenance)
    provenance = _with_under_compile(provenance, under_compile)  # the newer record, whole
    newer_in_step = new if in_step_record(new.provenance) is not None else old  # the newer in-step fields, whole
    provenance = {k: v for k, v in provenance.items() if not k.startswith(IN_STEP)}
    provenance.update({k: v for k, v in newer_in_step.provenance.items() if k.startswith(IN_STEP)})
    newer_compiled = new if any(k.startswith(COMPILED) for k in new.provenance) else old  # the problem's, whole
    provenance = {k: v for k, v in provenance.items() if not k.startswith(COMPILED)}
    provenance.update({k: v for k, v in newer_compiled.provenance.items() if k.startswith(COMPILED)})
    same_config = config_id(loser.config) == config_id(winner.config)
    if same_config:
        for kept in (DEMOTED, HELD, MODEL_VERIFIED):  # marks of this very config or problem, from either side
            value = new.provenance.get(kept, old.provenance.get(kept))
            if value is not None:
                provenance[kept] = value
    held = demotion(old) if winner is new and not same_config else None
    if held is not None and DEMOTED not in provenance and HELD not in provenance:
        provenance[HELD] = held
    return replace(winner, trials=tuple(trials.values()), provenance=provenance)


def _faster(a: float, b: float) -> bool:
    return math.isfinite(a) and (not math.isfinite(b) or a < b)
