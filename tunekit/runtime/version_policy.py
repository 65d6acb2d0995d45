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

The same one-time check, correctness only, guards every entry this machine did not tune (`trusted`): one imported
into the working cache (`imported_from`), one of a shipped database or model pack, one of a user kernel's package
database (tunekit.user_kernels.stored). Its verdict is recorded in `checked_here.json` under the entry's key, the
device and the config's digest (as the other-Triton verdicts are), kept in memory once read, so a process pays one
verification run per such problem the first time this machine meets it, and a config swapped after it passed is
checked again. A refused config is said in one warning and the next layer serves.

Only shipped entries are considered: a user's own cache, tuned under an older Triton, is re-tuned (`tunekit tune`
measures only what is missing, with the old trials as a warm start).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tunekit.core import settings
from tunekit.core.device import DeviceFingerprint
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.bounded_file import UnreadableFileError, load_json
from tunekit.store.entry import GPU_TIMER, IMPORTED, TORCH_MS, Entry, bad_record, config_digest
from tunekit.store.key import CacheKey

__all__ = ["Verdict", "candidate", "check_once", "checked_entry", "describe", "no_checks", "trusted", "verdicts_path"]

logger = logging.getLogger("tunekit")

FORMAT = "tunekit-other-triton"
CHECKED_FORMAT = "tunekit-checked-here"
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


def checked_path() -> Path:
    """The verdicts of the checks of entries this machine did not tune (imported or shipped: `trusted`)."""
    return settings.cache_dir() / "checked_here.json"


def _verdict_key(entry: Entry, device: DeviceFingerprint) -> str:
    """The entry's key, this device and its config: a config swapped after it passed is checked again."""
    return f"{entry.key.digest}:{device.key}:{config_digest(entry.config)}"


def _format(path: Path) -> str:
    return CHECKED_FORMAT if path.name == checked_path().name else FORMAT


# Per verdict file: (its signature when read, its verdicts); and the verdicts this process reached, by (file, key).
_READ: dict[Path, tuple[tuple[int, ...], dict[str, Any]]] = {}
_REACHED: dict[tuple[Path, str], Verdict] = {}


def _signature(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_verdicts(path: Path | None = None) -> dict[str, Any]:
    """The verdicts a file holds (kept until it changes: a miss of another key costs no parse)."""
    path = path or verdicts_path()
    signature = _signature(path)
    cached = _READ.get(path)
    if cached is not None and cached[0] == signature:
        return cached[1]
    try:  # the one bounded reader: never blocks on a FIFO, never recurses on deep nesting
        data = load_json(path, "the verdicts of checks run here")
    except UnreadableFileError as exc:
        if exc.missing:
            return {}
        logger.warning("tunekit: ignoring %s (%s): its entries are checked again", path, exc)
        return {}
    expected = _format(path)
    if not isinstance(data, dict) or data.get("format") != expected or not isinstance(data.get("verdicts"), dict):
        logger.warning("tunekit: ignoring %s: not a %s file", path, expected)
        return {}
    if signature is not None:
        _READ[path] = (signature, data["verdicts"])
    return data["verdicts"]


def recorded(entry: Entry, device: DeviceFingerprint, path: Path | None = None) -> Verdict | None:
    """The verdict of `entry`'s config on `device`: reached in this process, else read from the file."""
    path = path or verdicts_path()
    key = _verdict_key(entry, device)
    verdict = _REACHED.get((path, key))
    if verdict is None:
        verdict = Verdict.from_json(_read_verdicts(path).get(key))
        if verdict is not None:
            _REACHED[(path, key)] = verdict
    return verdict


def _record(entry: Entry, device: DeviceFingerprint, verdict: Verdict, path: Path | None = None, **fields: str) -> None:
    """Add the verdict to the file (atomically). A cache directory that cannot be written costs a re-check in the
    next process, never the call."""
    from tunekit.core.errors import TunekitError
    from tunekit.store.atomic import write_atomically

    path = path or verdicts_path()
    _REACHED[(path, _verdict_key(entry, device))] = verdict
    verdicts = dict(_read_verdicts(path))
    verdicts[_verdict_key(entry, device)] = {
        **verdict.to_json(),
        "kernel": entry.key.kernel,
        "problem": dict(entry.key.problem),
        "config": dict(entry.config),
        **fields,
        "triton": device.triton_version,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    document = {"format": _format(path), "schema": SCHEMA, "verdicts": verdicts}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, [json.dumps(document, indent=1, sort_keys=True)])
    except (OSError, TunekitError) as exc:
        logger.warning("tunekit: could not record the check of %s in %s: %s", entry.key.kernel, path, exc)


def other_triton_device_keys(device: DeviceFingerprint, shipped: Mapping[CacheKey, Entry]) -> list[str]:
    """The device keys of this device's hardware under another Triton version among the shipped entries, where
    dispatch may serve their entries (TUNEKIT_OTHER_TRITON is not "never")."""
    if settings.other_triton() == "never":
        return []
    return [key for key, _ in _other_triton_keys(device, shipped)]


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
        _record(entry, device, verdict, from_triton=str(entry.device.get("triton_version", "?")))
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
    if verdict.torch_ms is not None:  # both times just taken here, by the default timer on this GPU
        provenance[TORCH_MS] = verdict.torch_ms
        provenance["timer"] = GPU_TIMER
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


# ------------------------------------------------------------------------------------------ checked before served


def trusted(spec: KernelSpec, problem: Problem, device: DeviceFingerprint, entry: Entry, source: str) -> Entry | None:
    """dispatch's hook for the entry of `problem` found in layer `source` ("cache" or "shipped"): the entry where it
    may serve, None where it may not. An entry tuned here serves; one that came from an import or a shipped database
    or pack serves once its config passed the kernel's reference here (checked now, once per config, recorded in
    `checked_path()`). Under `no_checks` (tunekit show), or resolved for another device than this machine's (a
    report: a check runs only on the device itself), an unchecked entry is reported as it serves once it passes;
    while a graph is captured or traced, it is not served and the resolution is not kept (`provisional`)."""
    if source == "cache" and IMPORTED not in entry.provenance:
        return entry
    what = "imported" if source == "cache" else "shipped"
    verdict = recorded(entry, device, checked_path())
    if verdict is None and (not _CHECKS.get() or not _here(device)):
        return entry if bad_record(entry) is None else None
    if verdict is None and _capturing():
        raise Provisional(f"the {what} entry is checked on the first call outside a captured or traced graph")
    if verdict is None:
        verdict = _verdict_of(entry, device, what, lambda: verify_here(spec, problem, entry.config))
    return entry if verdict.served else None


def _here(device: DeviceFingerprint) -> bool:
    """Whether `device` is this machine's (where a check can run)."""
    from tunekit.core.device import fingerprint

    return device.key == fingerprint().key


class Provisional(Exception):
    """Raised by `trusted` where a check cannot run now (a graph captured or traced, the device out of memory):
    dispatch serves the next layer and keeps no memo of it. Never reaches a user."""


def check_once(entry: Entry, device: DeviceFingerprint, what: str, run: Callable[[], str | None]) -> Verdict | None:
    """The verdict of `entry`'s config on `device` under the kernel's own check: the recorded one, else `run()` now
    (None: correct; otherwise why not), recorded under the config's digest; a refusal is said in one warning line.
    `what` names where the entry came from ("imported", "shipped"). None where the check cannot run now (the
    device out of memory): nothing is recorded."""
    verdict = recorded(entry, device, checked_path())
    if verdict is not None:
        return verdict
    try:
        return _verdict_of(entry, device, what, run)
    except Provisional:
        return None


def _verdict_of(entry: Entry, device: DeviceFingerprint, what: str, run: Callable[[], str | None]) -> Verdict:
    from tunekit.core.render import brief, plain
    from tunekit.store.user_entries import user_problem_text

    bad = bad_record(entry)
    why = f"its own trials say {bad.status} ({bad.error})" if bad is not None else run()
    verdict = Verdict(why is None, "correct here" if why is None else why[:300])
    _record(entry, device, verdict, checked_path(), source=what)
    if why is not None:
        logger.warning(
            "tunekit: %s %s: the %s config %s %s here (%s); not served",
            plain(entry.key.kernel),
            user_problem_text(dict(entry.key.problem)),
            what,
            brief(dict(entry.config), 200),
            "fails" if why.startswith("fails") else "gives wrong results",
            plain(why[:200]),
        )
    return verdict


def verify_here(spec: KernelSpec, problem: Problem, config: Mapping[str, Any], seed: int = 0) -> str | None:
    """`config` run once on fresh inputs with its outputs poisoned and compared with the reference (what the tuner
    checks of every candidate): None when correct, else why not. No autograd and no autocast, as `check`. A device
    out of memory raises Provisional: the check is not the config's to fail."""
    import torch

    from tunekit.tuning.spot_check import check_here

    try:
        return check_here(spec, problem, config, seed)
    except torch.OutOfMemoryError:
        raise Provisional("the device is out of memory: checked on a later call") from None
    except Exception as exc:  # an entry from elsewhere may break in any way: whatever it is, it is not served
        return f"fails here: {type(exc).__name__}: {str(exc)[:200]}"
