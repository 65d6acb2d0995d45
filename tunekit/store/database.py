"""Tuning databases: a versioned JSON document of entries. Export, validated import and merge, shipped DBs.

An imported document is checked as strictly as serving checks a config, before anything is written:
- its size is capped and it is read with bounded memory: the text, then one entry at a time
  (tunekit.store.document_reader);
- a key twice in one JSON object, or one cache key twice in the entries, is an error;
- every config is in its kernel's space, and the best config and every config measured "ok" pass the space's rules
  for the entry's problem on the entry's device (the device object must be the one its key names);
- no time is below the physical floor of its problem (`time_floor_ms`);
- the local best is kept unless the imported entry was measured faster by the same timer (`provenance.timer`);
  an import never overwrites a local trial record nor makes best a config local trials measured wrong or failed,
  and an imported best is served only after its config passed the kernel's check here once
  (tunekit.runtime.version_policy.trusted).
Export writes atomically (tunekit.store.atomic): a full disk leaves the old file whole, and a symbolic link at the
destination is refused, never followed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import itertools
import json
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from tunekit.core.device import DeviceFingerprint
from tunekit.core.errors import DatabaseError, TunekitError
from tunekit.core.problems import problem_error
from tunekit.core.registry import get_spec, kernel_names
from tunekit.core.render import all_text, brief, plain
from tunekit.core.space import config_id
from tunekit.core.spec import KernelSpec
from tunekit.store.atomic import write_atomically
from tunekit.store.document_reader import FORMAT, DocumentText, open_document
from tunekit.store.entry import (
    HELD,
    IMPORTED,
    LOCAL_MARKS,
    TRIAL_STATUSES,
    Entry,
    bad_record,
    demotion,
    merge_entries,
)
from tunekit.store.floors import floor_text, time_floor_ms
from tunekit.store.key import SCHEMA_VERSION, CacheKey
from tunekit.store.store import Store
from tunekit.store.user_entries import is_user_kernel, user_problem_text, validate_user_entry

logger = logging.getLogger("tunekit")

_MAX_TIME_MS = 1e7  # a measured time above ~3 hours is not a measurement


def document(entries: Iterable[Entry]) -> dict[str, Any]:
    ordered = sorted(entries, key=lambda e: (e.key.kernel, e.key.device_key, e.key.digest))
    return {"format": FORMAT, "schema": SCHEMA_VERSION, "entries": [e.to_json() for e in ordered]}


def export_entries(store: Store, kernel: str | None = None, device_key: str | None = None) -> list[Entry]:
    if kernel is not None and not is_user_kernel(kernel):
        get_spec(kernel)  # unknown names fail with the list of valid ones
    return [
        e
        for e in store.entries()
        if (kernel is None or e.key.kernel == kernel) and (device_key is None or e.key.device_key == device_key)
    ]


def write_document(path: Path, entries: Iterable[Entry]) -> int:
    """Write a database to `path` atomically (tunekit.store.atomic): on any failure, a full disk included, the previous
    file is left as it was; a symbolic link at `path` is refused, never followed."""
    doc = document(entries)
    chunks = json.JSONEncoder(indent=1, sort_keys=True).iterencode(doc)
    write_atomically(Path(path), itertools.chain(chunks, ["\n"]), DatabaseError)
    return len(doc["entries"])


def _require(cond: bool, where: str, rule: str) -> None:
    if not cond:
        raise DatabaseError(f"{where}: {rule}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _validate_time(value: Any, where: str, floor_ms: float) -> None:
    _require(
        _is_number(value) and 0 < value < _MAX_TIME_MS,
        where,
        f"time_ms must be a number in (0, {_MAX_TIME_MS:g}), but got {brief(value)}",
    )
    _require(
        value >= floor_ms,
        where,
        f"time_ms must be at least {floor_ms:.3g}, the physical floor of this problem ({floor_text()}), "
        f"but got {brief(value)}",
    )


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool)) or _is_number(value)


def _validate_flat(obj: dict[str, Any], where: str, name: str) -> None:
    """device and provenance are flat records of JSON scalars (shown by `tunekit show`, never interpreted)."""
    for field_name, value in obj.items():
        _require(
            _is_json_scalar(value) and not (isinstance(value, str) and len(value) > 1000),
            where,
            f"{name} values must be strings, numbers, bools or null, but {name}.{field_name} is {brief(value)}",
        )
    if name == "device":
        _require(
            isinstance(obj.get("name", ""), str), where, f"device.name must be a string, got {brief(obj.get('name'))}"
        )


_TYPE_NAMES = {int: "an int", str: "a string", bool: "a bool"}


_DEVICE_FIELD_TYPES: dict[str, type] = {
    name: int if field.type in (int, "int") else str for name, field in DeviceFingerprint.__dataclass_fields__.items()
}


def _device(data: dict[str, Any], device_key: str, where: str) -> DeviceFingerprint:
    """The fingerprint an entry's device object describes; it must be the device its key names."""
    for name, want in _DEVICE_FIELD_TYPES.items():
        value = data.get(name)
        _require(
            type(value) is str if want is str else type(value) is int and 0 <= value < 2**53,
            where,
            f"device.{name} must be {_TYPE_NAMES[want]}, but got {brief(value)}",
        )
    device = DeviceFingerprint(**{name: data[name] for name in _DEVICE_FIELD_TYPES})
    _require(
        device.key == device_key,
        where,
        f"the device object is not the device key.device_key names (it hashes to {device.key}, not {device_key})",
    )
    return device


def _check_rules(
    spec: KernelSpec, config: dict[str, Any], problem: dict[str, Any], device: DeviceFingerprint, where: str
) -> None:
    """A config passes the space's rules for its problem on its device, as serving requires."""
    try:
        broken = [rule for rule in spec.space.rules if not rule.check(config, problem, device)]
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise DatabaseError(
            f"{where}: config cannot be checked against the {spec.name} space's rules for "
            f"{spec.describe_problem(problem)} ({type(exc).__name__}: {exc})"
        ) from None
    if broken:
        rules = ", ".join(f"{rule.name!r}" + (f" ({rule.why})" if rule.why else "") for rule in broken)
        raise DatabaseError(
            f"{where}: config {brief(config)} breaks the {spec.name} space's rule {rules} "
            f"for {spec.describe_problem(problem)} on {device.name}"
        )


def validate_entry(data: Any, index: int = 0, where: str | None = None) -> Entry:
    """Check one entry completely before anything is written: structure, kernel, device, space membership and
    rules, physical floors of its times. Errors start with `where` (default: "entry INDEX")."""
    where = where or f"entry {index}"
    _require(isinstance(data, dict), where, f"must be an object, but got {type(data).__name__}")
    _require(all_text(data), where, "a string in it is not valid Unicode text (a lone surrogate such as \\ud800)")
    for name in ("key", "best", "device", "provenance"):
        _require(isinstance(data.get(name), dict), where, f"field {name!r} must be an object")
    key = data["key"]
    schema = key.get("schema")
    _require(
        type(schema) is int and schema == SCHEMA_VERSION,
        where,
        f"key schema must be {SCHEMA_VERSION}, got {brief(schema)}",
    )
    kernel = key.get("kernel")
    if isinstance(kernel, str) and is_user_kernel(kernel):
        return validate_user_entry(data, where)  # checked as data: its code is never imported
    _require(
        isinstance(kernel, str) and kernel in kernel_names(),
        where,
        f"unknown kernel {brief(kernel)}. Available: {kernel_names()}",
    )
    assert isinstance(kernel, str)
    for name in ("source_hash", "device_key"):
        _require(
            isinstance(key.get(name), str) and 0 < len(key[name]) <= 64, where, f"key.{name} must be a short string"
        )
    spec = get_spec(kernel)
    problem = key.get("problem")
    _require(isinstance(problem, dict), where, "key.problem must be an object")
    for field_name, value in problem.items():
        _require(
            isinstance(value, (str, bool)) or (isinstance(value, int) and 0 <= value < 2**40),
            where,
            f"key.problem.{field_name} must be a string, bool or int in [0, 2^40), but got {brief(value)}",
        )
    error = problem_error(spec, problem, "key.problem")
    _require(error is None, where, str(error))
    _validate_flat(data["device"], where, "device")
    _validate_flat(data["provenance"], where, "provenance")
    device = _device(data["device"], key["device_key"], where)
    try:
        config = spec.space.check_membership(data["best"].get("config"))
    except TunekitError as exc:
        raise DatabaseError(f"{where}: best.config outside the {kernel} space: {exc}") from None
    _check_rules(spec, config, problem, device, where + ".best")
    floor_ms = time_floor_ms(spec, problem, device)
    _validate_time(data["best"].get("time_ms"), where + ".best", floor_ms)
    _validate_trials(data.get("trials", []), spec, problem, device, where, floor_ms)
    try:
        return Entry.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise DatabaseError(f"{where}: malformed ({exc})") from None


def _validate_trials(
    trials: Any, spec: KernelSpec, problem: dict[str, Any], device: DeviceFingerprint, where: str, floor_ms: float
) -> None:
    """An entry's trial records: statuses, configs in the space, the rules and time floors of the measured ones."""
    kernel = spec.name
    _require(isinstance(trials, list), where, "trials must be a list")
    for j, trial in enumerate(trials):
        twhere = f"{where}.trials[{j}]"
        _require(
            isinstance(trial, dict) and trial.get("status") in TRIAL_STATUSES,
            twhere,
            f"status must be one of {list(TRIAL_STATUSES)}",
        )
        try:
            trial_config = spec.space.check_membership(trial.get("config"))
        except TunekitError as exc:
            raise DatabaseError(f"{twhere}: config outside the {kernel} space: {exc}") from None
        if trial["status"] == "ok":  # a measured config: it ran, so it passes the rules; wrong or failed may not
            _check_rules(spec, trial_config, problem, device, twhere)
            _validate_time(trial.get("time_ms"), twhere, floor_ms)
        else:
            t = trial.get("time_ms")
            _require(t is None or _is_number(t), twhere, f"time_ms must be a number or null, but got {brief(t)}")
        error = trial.get("error")
        _require(
            error is None or isinstance(error, str), twhere, f"error must be a string or null, but got {brief(error)}"
        )


def _entries(doc: DocumentText) -> Iterator[Entry]:
    """Each entry validated in turn (DatabaseError on the first problem); a cache key twice is an error."""
    first_at: dict[str, int] = {}
    for index, data in enumerate(doc.objects()):
        entry = validate_entry(data, index)
        seen = first_at.setdefault(entry.key.digest, index)
        _require(
            seen == index,
            f"entry {index}",
            f"the same key as entry {seen} ({entry.key.kernel} "
            f"{','.join(f'{k}={v}' for k, v in entry.key.problem)}): a document holds each key once",
        )
        yield entry


def read_document(path: Path) -> list[Entry]:
    """Parse and validate a whole file; raise DatabaseError on the first problem. Nothing is written here."""
    return list(_entries(open_document(path)))


@dataclass(frozen=True)
class ImportResult:
    read: int
    added: int  # keys the store did not hold
    improved: int  # keys whose best the imported entry replaced (faster, by the same timer)
    kept: int  # keys whose local best stayed (as fast or faster, or measured by another timer)
    refused: int = 0  # keys whose imported best local trials measured wrong or failed (the local entry stays)

    @property
    def changed(self) -> int:
        return self.added + self.improved


def import_document(store: Store, path: Path) -> ImportResult:
    """Validated merge. Every entry is checked before the first write; then all are written in one transaction
    (a failure part-way leaves the store as it was)."""
    doc = open_document(path)
    for _ in _entries(doc):  # validate everything first, holding no lock and one entry at a time
        pass
    outcomes = {"added": 0, "improved": 0, "kept": 0, "refused": 0}
    with store.transaction():
        for entry in _entries(doc):
            outcomes[_import_one(store, entry, path)] += 1
    return ImportResult(len(doc), **outcomes)


def same_timer(a: Entry, b: Entry) -> bool:
    """Both bests were measured by the same, named timer (times of different timers are not comparable)."""
    timer = a.provenance.get("timer")
    return isinstance(timer, str) and bool(timer) and timer == b.provenance.get("timer")


def _import_one(store: Store, entry: Entry, path: Path) -> str:
    """Merge one validated entry: 'added', 'improved', 'kept' or 'refused' (the local entry is left as it was, not a
    byte written). What an import may not change: a local trial record (the file's records of configs measured here
    are dropped), a best whose config local trials measured wrong or failed (refused, in one warning), and marks only
    this machine sets (tunekit.store.entry.LOCAL_MARKS). An imported best is served after one check here
    (tunekit.runtime.version_policy.trusted), as its `imported_from` provenance says."""
    provenance = {k: v for k, v in entry.provenance.items() if k not in LOCAL_MARKS}
    incoming = dataclasses.replace(entry, provenance={**provenance, IMPORTED: path.name})
    before = store.get(entry.key)
    if before is None:
        store.put(incoming)
        return "added"
    if not same_timer(before, entry):
        return "kept"  # not comparable: the local best and its trials stay as they are
    bad = bad_record(before, entry.config)
    if bad is not None:
        logger.warning(
            "tunekit: %s: not imported for %s %s: its best config %s was measured %s here (%s); the local entry stays",
            plain(path.name),
            plain(entry.key.kernel),
            user_problem_text(dict(entry.key.problem)),
            brief(entry.config, 200),
            bad.status,
            plain(str(bad.error)[:200]),
        )
        return "refused"
    measured_here = {config_id(t.config) for t in before.trials}
    incoming = dataclasses.replace(
        incoming, trials=tuple(t for t in entry.trials if config_id(t.config) not in measured_here)
    )
    merged = merge_entries(before, incoming)
    if merged.config == before.config and merged.time_ms == before.time_ms:
        return "kept"
    store.put(incoming)
    return "improved"


PACKS = "packs"  # cache/packs/<model>.json: the model packs (tunekit.evaluation.model_packs)


def _shipped_files(root: Traversable) -> Iterator[tuple[Traversable, str | None]]:
    """Each database under `root` with the model pack it is (None for the device databases), sorted by name."""
    for item in sorted(root.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            yield item, None
    packs = root / PACKS
    if packs.is_dir():
        for item in sorted(packs.iterdir(), key=lambda p: p.name):
            if item.name.endswith(".json"):
                yield item, item.name.removesuffix(".json")


def read_shipped(root: Traversable) -> dict[CacheKey, Entry]:
    """Every entry of the databases in `root` and `root`/packs, a pack's entries with the pack's name in their
    provenance ("pack"); where two hold one key, their merge (tunekit.store.entry.merge_entries: the faster best, a
    demotion kept from either). A bad file is skipped with a warning."""
    found: dict[CacheKey, Entry] = {}
    for item, pack in _shipped_files(root):
        try:
            with importlib.resources.as_file(item) as path:
                entries = read_document(Path(path))
        except DatabaseError as exc:
            logger.warning("tunekit: skipping shipped database %s: %s", item.name, exc)
            continue
        for entry in entries:
            if pack is not None:
                entry = dataclasses.replace(entry, provenance={**entry.provenance, "pack": pack})
            old = found.get(entry.key)
            # two packs holding one problem: the faster best, demoted if either pack's model was slower with it
            found[entry.key] = entry if old is None else _merge_shipped(old, entry)
    return found


def _merge_shipped(a: Entry, b: Entry) -> Entry:
    """Two shipped databases' entries of one key: their merge, and the problem demoted (held) where either is."""
    merged = merge_entries(a, b)
    why = demotion(a) or demotion(b)
    if why is None or demotion(merged) is not None:
        return merged
    return dataclasses.replace(merged, provenance={**merged.provenance, HELD: why})


@functools.lru_cache(maxsize=1)
def shipped_entries() -> dict[CacheKey, Entry]:
    """Every entry shipped in the package's cache/ and cache/packs/ (read-only): `read_shipped` of the installed
    `tunekit.shipped`."""
    return read_shipped(importlib.resources.files("tunekit.shipped"))


@functools.lru_cache(maxsize=1)
def _shipped_by_scope() -> dict[tuple[str, str], list[Entry]]:
    by_scope: dict[tuple[str, str], list[Entry]] = {}
    for entry in shipped_entries().values():
        by_scope.setdefault((entry.key.kernel, entry.key.device_key), []).append(entry)
    return by_scope


def shipped_scope(kernel: str, device_key: str) -> list[Entry]:
    """The shipped entries of one kernel on one device (the nearest-entry scan's share of the shipped set)."""
    return list(_shipped_by_scope().get((kernel, device_key), ()))
