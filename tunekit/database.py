"""Tuning databases: a versioned JSON document of entries. Export, validated import and merge, shipped DBs."""

from __future__ import annotations

import functools
import importlib.resources
import json
import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tunekit.cache_key import SCHEMA_VERSION, CacheKey
from tunekit.device import fingerprint
from tunekit.entry import TRIAL_STATUSES, Entry
from tunekit.errors import DatabaseError, TunekitError
from tunekit.registry import get_spec, kernel_names
from tunekit.spec import KernelSpec
from tunekit.store import Store

logger = logging.getLogger("tunekit")

FORMAT = "tunekit-db"
_MAX_TIME_MS = 1e7  # a measured time above ~3 hours is not a measurement


def document(entries: Iterable[Entry]) -> dict[str, Any]:
    ordered = sorted(entries, key=lambda e: (e.key.kernel, e.key.device_key, e.key.digest))
    return {"format": FORMAT, "schema": SCHEMA_VERSION, "entries": [e.to_json() for e in ordered]}


def export_entries(store: Store, kernel: str | None = None, device_key: str | None = None) -> list[Entry]:
    if kernel is not None:
        get_spec(kernel)  # unknown names fail with the list of valid ones
    return [
        e
        for e in store.entries()
        if (kernel is None or e.key.kernel == kernel) and (device_key is None or e.key.device_key == device_key)
    ]


def write_document(path: Path, entries: Iterable[Entry]) -> int:
    doc = document(entries)
    try:
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise DatabaseError(f"cannot write {path}: {exc}") from exc
    return len(doc["entries"])


def _require(cond: bool, where: str, rule: str) -> None:
    if not cond:
        raise DatabaseError(f"{where}: {rule}")


def _show(value: Any) -> str:
    """A bad value for a one-line message: repr, cut short (a hostile file may hold megabytes in one field)."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _validate_time(value: Any, where: str) -> None:
    _require(
        _is_number(value) and 0 < value < _MAX_TIME_MS,
        where,
        f"time_ms must be a number in (0, {_MAX_TIME_MS:g}), but got {_show(value)}",
    )


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool)) or _is_number(value)


def _validate_flat(obj: dict[str, Any], where: str, name: str) -> None:
    """device and provenance are flat records of JSON scalars (shown by `tunekit show`, never interpreted)."""
    for field_name, value in obj.items():
        _require(
            _is_json_scalar(value) and not (isinstance(value, str) and len(value) > 1000),
            where,
            f"{name} values must be strings, numbers, bools or null, but {name}.{field_name} is {_show(value)}",
        )
    if name == "device":
        _require(
            isinstance(obj.get("name", ""), str), where, f"device.name must be a string, got {_show(obj.get('name'))}"
        )


_PROBLEM_TYPES: dict[str, dict[str, type]] = {}


def _problem_types(spec: KernelSpec) -> dict[str, type]:
    """The type of each problem field, as the spec's own default problems use it (where they all agree)."""
    types = _PROBLEM_TYPES.get(spec.name)
    if types is None:
        seen: dict[str, set[type]] = {}
        for problem in spec.default_problems(fingerprint()):
            for name, value in problem.items():
                seen.setdefault(name, set()).add(type(value))
        types = _PROBLEM_TYPES[spec.name] = {n: next(iter(t)) for n, t in seen.items() if len(t) == 1}
    return types


_TYPE_NAMES = {int: "an int", str: "a string", bool: "a bool"}


def validate_entry(data: Any, index: int) -> Entry:
    """Check one entry completely before anything is written: structure, kernel, space membership, times."""
    where = f"entry {index}"
    _require(isinstance(data, dict), where, f"must be an object, but got {type(data).__name__}")
    for name in ("key", "best", "device", "provenance"):
        _require(isinstance(data.get(name), dict), where, f"field {name!r} must be an object")
    key = data["key"]
    schema = key.get("schema")
    _require(
        type(schema) is int and schema == SCHEMA_VERSION,
        where,
        f"key schema must be {SCHEMA_VERSION}, got {_show(schema)}",
    )
    kernel = key.get("kernel")
    _require(
        isinstance(kernel, str) and kernel in kernel_names(),
        where,
        f"unknown kernel {_show(kernel)}. Available: {kernel_names()}",
    )
    assert isinstance(kernel, str)
    for name in ("source_hash", "device_key"):
        _require(
            isinstance(key.get(name), str) and 0 < len(key[name]) <= 64, where, f"key.{name} must be a short string"
        )
    spec = get_spec(kernel)
    problem = key.get("problem")
    _require(
        isinstance(problem, dict) and sorted(problem) == sorted(spec.problem_fields),
        where,
        f"key.problem must have exactly the fields {sorted(spec.problem_fields)}",
    )
    types = _problem_types(spec)
    for field_name, value in problem.items():
        _require(
            isinstance(value, (str, bool)) or (isinstance(value, int) and 0 <= value < 2**40),
            where,
            f"key.problem.{field_name} must be a string, bool or int in [0, 2^40), but got {_show(value)}",
        )
        want = types.get(field_name)
        _require(
            want is None or type(value) is want,
            where,
            f"key.problem.{field_name} must be {_TYPE_NAMES.get(want or str, 'a scalar')}, but got {_show(value)}",
        )
    _validate_flat(data["device"], where, "device")
    _validate_flat(data["provenance"], where, "provenance")
    try:
        spec.space.check_membership(data["best"].get("config"))
    except TunekitError as exc:
        raise DatabaseError(f"{where}: best.config outside the {kernel} space: {exc}") from None
    _validate_time(data["best"].get("time_ms"), where + ".best")
    trials = data.get("trials", [])
    _require(isinstance(trials, list), where, "trials must be a list")
    for j, trial in enumerate(trials):
        twhere = f"{where}.trials[{j}]"
        _require(
            isinstance(trial, dict) and trial.get("status") in TRIAL_STATUSES,
            twhere,
            f"status must be one of {list(TRIAL_STATUSES)}",
        )
        try:
            spec.space.check_membership(trial.get("config"))
        except TunekitError as exc:
            raise DatabaseError(f"{twhere}: config outside the {kernel} space: {exc}") from None
        if trial["status"] == "ok":
            _validate_time(trial.get("time_ms"), twhere)
        else:
            t = trial.get("time_ms")
            _require(t is None or _is_number(t), twhere, f"time_ms must be a number or null, but got {_show(t)}")
        error = trial.get("error")
        _require(
            error is None or isinstance(error, str), twhere, f"error must be a string or null, but got {_show(error)}"
        )
    try:
        return Entry.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise DatabaseError(f"{where}: malformed ({exc})") from None


def read_document(path: Path) -> list[Entry]:
    """Parse and validate a whole file; raise DatabaseError on the first problem. Nothing is written here."""
    try:
        raw = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatabaseError(f"cannot read {path}: {exc}") from exc
    try:
        doc = json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:
        raise DatabaseError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise DatabaseError(f"{path} is not a {FORMAT} document: nested too deeply") from None
    _require(isinstance(doc, dict) and doc.get("format") == FORMAT, str(path), f"not a {FORMAT} document")
    _require(
        type(doc.get("schema")) is int and doc.get("schema") == SCHEMA_VERSION,
        str(path),
        f"schema must be {SCHEMA_VERSION}, but got {_show(doc.get('schema'))}",
    )
    entries = doc.get("entries")
    _require(isinstance(entries, list), str(path), "'entries' must be a list")
    return [validate_entry(item, i) for i, item in enumerate(entries)]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (times and values must be finite numbers)")


def import_document(store: Store, path: Path) -> tuple[int, int]:
    """Validated merge: all entries are checked before the first write, and all are written in one transaction
    (a failure part-way leaves the store as it was). Returns (entries read, entries changed)."""
    entries = read_document(path)
    with store.transaction():
        return len(entries), sum(_import_one(store, entry, path) for entry in entries)


def _import_one(store: Store, entry: Entry, path: Path) -> int:
    """Merge one validated entry; 1 when it added or improved the stored entry."""
    before = store.get(entry.key)
    provenance = {**entry.provenance, "imported_from": path.name}
    after = store.put(Entry(entry.key, entry.config, entry.time_ms, entry.device, provenance, entry.trials))
    return int(before is None or after.config != before.config or after.time_ms != before.time_ms)


@functools.lru_cache(maxsize=1)
def shipped_entries() -> dict[CacheKey, Entry]:
    """Every entry of the databases shipped in cache/ (read-only). A bad file is skipped with a warning."""
    found: dict[CacheKey, Entry] = {}
    root = importlib.resources.files("tunekit.shipped")
    for item in sorted(root.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        try:
            with importlib.resources.as_file(item) as path:
                entries = read_document(Path(path))
        except DatabaseError as exc:
            logger.warning("tunekit: skipping shipped database %s: %s", item.name, exc)
            continue
        for entry in entries:
            old = found.get(entry.key)
            if old is None or entry.time_ms < old.time_ms:
                found[entry.key] = entry
    return found
