"""Shipped entries recorded under another Triton version: served after a one-time check in the user's process.

The shipped databases are keyed to the Triton they were tuned with (3.6.0), and a device key includes the Triton
version, because Triton's code generation decides what a config compiles to. A wheel install brings whatever
Triton pip resolves (3.9.0 on 2026-11-26), and without this module such a user would get none of the shipped
tuning. The policy (TUNEKIT_OTHER_TRITON, default `check`):

- A shipped entry of this very device (same hardware fields) and kernel identity, recorded under another Triton
  version, is a candidate for a problem with no entry of its own.
- The first time a process resolves that problem, the entry is checked here: its config compiles and runs, its
  outputs match the reference (tunekit.tuning.verify, outputs poisoned first), and on a GPU it beats torch's own
  op timed now with the same timer (or, for a kernel without a torch baseline, runs within 10% of its record).
  In the interpreter correctness is all that is checked: its timings mean nothing.
- The verdict is recorded in `other_triton.json` in the cache directory, per entry and per device key (which
  includes this Triton's version), so it is never repeated; a verdict is data read back and validated like any
  file tunekit reads. A served entry carries the time and torch time measured here, so dispatch's torch rules
  (tunekit.runtime.dispatch._tuned) judge it by today's numbers. A refused one leaves the problem to the
  untuned layers (torch's op on a GPU).
- `TUNEKIT_OTHER_TRITON=never` serves no such entry. `tunekit show` says, per entry, which of these applies.

Only shipped entries are considered: a user's own cache, tuned under an older Triton, is re-tuned (`tunekit tune`
measures only what is missing, with the old trials as a warm start).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tunekit.core import settings
from tunekit.core.device import DeviceFingerprint
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TORCH_MS, Entry
from tunekit.store.key import CacheKey

__all__ = ["Verdict", "candidate", "checked_entry", "describe", "no_checks", "verdicts_path"]

logger = logging.getLogger("tunekit")

FORMAT = "tunekit-other-triton"
SCHEMA = 1
RECORD_SLACK = 1.10  # without a torch baseline: served within 10% of the time it was recorded with
_CHECKS: contextvars.ContextVar[bool] = contextvars.ContextVar("tunekit_other_triton_checks", default=True)


@dataclass(frozen=True)
class Verdict:
    """The one-time check of an entry recorded under Triton `from_triton`, run under this device's Triton."""

    served: bool
    reason: str  # why (one line)
    time_ms: float | None = None  # measured here
    torch_ms: float | None = None  # torch's op measured here (None: no baseline, or the interpreter)

    def to_json(self) -> dict[str, Any]:
        return {"served": self.served, "reason": self.reason, "time_ms": self.time_ms, "torch_ms": self.torch_ms}

    @classmethod
    def from_json(cls, data: object) -> Verdict | None:
        """A verdict read back, or None where it is not one (the file is data: a bad record is checked again)."""
        if not isinstance(data, dict) or not isinstance(data.get("served"), bool):
            return None
        reason = data.get("reason")
        times = [data.get("time_ms"), data.get("torch_ms")]
        if not isinstance(reason, str) or not all(_time_or_none(t) for t in times):
            return None
        return cls(data["served"], reason[:300], *(float(t) if t is not None else None for t in times))


def _time_or_none(value: object) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e9)


@contextlib.contextmanager
def no_checks() -> Iterator[None]:
    """Resolve from recorded verdicts only, running no check (what `tunekit show` does: it reports, never runs)."""
    token = _CHECKS.set(False)
    try:
        yield
    finally:
        _CHECKS.reset(token)


def verdicts_path() -> Path:
    return settings.cache_dir() / "other_triton.json"


def _verdict_key(entry: Entry, device: DeviceFingerprint) -> str:
    return f"{entry.key.digest}:{device.key}"


def _read_verdicts() -> dict[str, Any]:
    try:
        data = json.loads(verdicts_path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("tunekit: ignoring %s (%s): its entries are checked again", verdicts_path(), exc)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("verdicts"), dict):
        logger.warning("tunekit: ignoring %s: not a %s file", verdicts_path(), FORMAT)
        return {}
    return data["verdicts"]


def recorded(entry: Entry, device: DeviceFingerprint) -> Verdict | None:
    return Verdict.from_json(_read_verdicts().get(_verdict_key(entry, device)))


def _record(entry: Entry, device: DeviceFingerprint, verdict: Verdict, from_triton: str) -> None:
    """Add the verdict to the file (atomically). A cache directory that cannot be written costs a re-check in the
    next process, never the call."""
    from tunekit.core.errors import TunekitError
    from tunekit.store.atomic import write_atomically

    verdicts = _read_verdicts()
    verdicts[_verdict_key(entry, device)] = {
        **verdict.to_json(),
        "kernel": entry.key.kernel,
        "problem": dict(entry.key.problem),
        "from_triton": from_triton,
        "triton": device.triton_version,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    document = {"format": FORMAT, "schema": SCHEMA, "verdicts": verdicts}
    try:
        verdicts_path().parent.mkdir(parents=True, exist_ok=True)
        write_atomically(verdicts_path(), [json.dumps(document, indent=1, sort_keys=True)])
    except (OSError, TunekitError) as exc:
        logger.warning("tunekit: could not record the Triton check of %s: %s", entry.key.kernel, exc)


def _other_triton_keys(device: DeviceFingerprint, entries: Mapping[CacheKey, Entry]) -> list[tuple[str, str]]:
    """(device key, Triton version) of this device's hardware under other Triton versions, among `entries`'
    devices; the newest version first."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    for entry in entries.values():
        if entry.key.device_key in seen or entry.key.device_key == device.key:
            continue
        seen.add(entry.key.device_key)
        try:
            stored = DeviceFingerprint.from_json(dict(entry.device))
        except (KeyError, TypeError):
            continue
        if (
            stored.key == entry.key.device_key
            and replace(stored, triton_version=device.triton_version).key == device.key
        ):
            found[stored.key] = stored.triton_version
    return sorted(found.items(), key=lambda kv: _version_tuple(kv[1]), reverse=True)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split(".")[:3])


def candidate(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, shipped: Mapping[CacheKey, Entry]
) -> Entry | None:
    """The shipped entry of this problem recorded on this device's hardware under another Triton version, or None."""
    if settings.other_triton() == "never":
        return None
    for device_key, _ in _other_triton_keys(device, shipped):
        entry = shipped.get(CacheKey.make(spec.name, spec.source_hash, device_key, problem))
        if entry is not None and spec.space.is_valid(entry.config, problem, device):
            return entry
    return None


def checked_entry(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, shipped: Mapping[CacheKey, Entry]
) -> Entry | None:
    """dispatch's hook: another Triton's shipped entry for `problem` that passed its check here (checked now, once,
    if it never was), with the times measured here; None where there is none or it failed."""
    entry = candidate(spec, problem, device, shipped)
    if entry is None:
        return None
    verdict = recorded(entry, device)
    if verdict is None:
        if not _CHECKS.get() or _capturing():
            return None
        verdict = check(spec, problem, entry, device)
        _record(entry, device, verdict, str(entry.device.get("triton_version", "?")))
        logger.info(
            "tunekit: %s %s, Triton %s entry: %s",
            spec.name,
            problem,
            entry.device.get("triton_version"),
            verdict.reason,
        )
    if not verdict.served:
        return None
    provenance = dict(entry.provenance)
    provenance.pop(TORCH_MS, None)
    if verdict.torch_ms is not None:
        provenance[TORCH_MS] = verdict.torch_ms
    return replace(entry, time_ms=verdict.time_ms or entry.time_ms, provenance=provenance)


def _capturing() -> bool:
    """A CUDA graph being captured or a graph being traced: no place to compile, time and synchronize. The problem
    is served as if no such entry existed, for this process; the check waits for a miss outside."""
    import torch

    if torch.compiler.is_compiling():
        return True
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check(spec: KernelSpec, problem: Problem, entry: Entry, device: DeviceFingerprint) -> Verdict:
    """Compile, verify and time `entry`'s config here; torch's op timed beside it."""
    from tunekit.core import backend
    from tunekit.tuning.spot_check import measure_here

    try:
        record, torch_ms = measure_here(spec, problem, entry.config)
    except Exception as exc:  # another Triton may break a config in any way: whatever it is, torch serves
        return Verdict(False, f"fails here: {type(exc).__name__}: {str(exc)[:200]}")
    if record.status != "ok" or record.time_ms is None:
        return Verdict(False, f"{record.status} here: {record.error}")
    if backend.INTERPRETED:
        return Verdict(True, "correct here (the interpreter: not timed)", record.time_ms)
    if torch_ms is not None:
        if record.time_ms < torch_ms:
            return Verdict(
                True, f"{record.time_ms:.4f} ms here, faster than torch's {torch_ms:.4f} ms", record.time_ms, torch_ms
            )
        return Verdict(
            False, f"{record.time_ms:.4f} ms here, not faster than torch's {torch_ms:.4f} ms", record.time_ms, torch_ms
        )
    if record.time_ms <= entry.time_ms * RECORD_SLACK:
        return Verdict(
            True, f"{record.time_ms:.4f} ms here, within 10% of its record {entry.time_ms:.4f} ms", record.time_ms
        )
    return Verdict(
        False, f"{record.time_ms:.4f} ms here, over 10% slower than its record {entry.time_ms:.4f} ms", record.time_ms
    )


def describe(entry: Entry, device: DeviceFingerprint) -> str:
    """What `tunekit show` says of a shipped entry recorded under another Triton on this device's hardware."""
    theirs = entry.device.get("triton_version", "?")
    if settings.other_triton() == "never":
        return f"Triton {theirs} entry, not served under Triton {device.triton_version} (TUNEKIT_OTHER_TRITON=never)"
    verdict = recorded(entry, device)
    if verdict is None:
        return f"Triton {theirs} entry: checked under Triton {device.triton_version} on first use, served if it passes"
    what = "serves" if verdict.served else "refused, torch serves"
    return f"Triton {theirs} entry, checked under Triton {device.triton_version}: {what} ({verdict.reason})"
