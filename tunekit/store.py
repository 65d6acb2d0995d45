"""The working cache store: diskcache under the user cache dir, JSON payloads keyed by the hashed CacheKey.

What it promises (tests/test_store.py, test_cache_integrity.py, test_concurrency.py):
- Many processes may read and write at once: `put` is a read-merge-write inside one SQLite write transaction
  (BEGIN IMMEDIATE), so no concurrent writer's trials are lost and the faster best is kept per key.
- Nothing wrong is served: a payload that does not parse, does not match its key, was written by a newer schema,
  or (for the kernel's current source) names fields or values outside the kernel's space is skipped with one
  warning naming the reason, as if absent.
- Reading never raises: a store whose file is corrupted or truncated yields nothing (with one warning saying
  where it is and how to fix it), so dispatch falls back to the next layer. Opening an unreadable store, and
  writing to one, raise CacheError with a one-line message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache

from tunekit import registry, settings
from tunekit.cache_key import SCHEMA_VERSION, CacheKey
from tunekit.entry import TRIAL_STATUSES, Entry, merge_entries
from tunekit.errors import CacheError, TunekitError

logger = logging.getLogger("tunekit")

_warned: set[tuple[str, str]] = set()  # (store directory or digest, reason): each said once per process


def _warn_once(what: str, reason: str, message: str) -> None:
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        logger.warning("%s", message)


class Store:
    """Entries by key. Safe for many processes: every write is a read-merge-write in one transaction."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else settings.cache_dir()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(str(self.directory), timeout=60)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise CacheError(
                f"cannot open the cache store at {self.directory} ({exc.__class__.__name__}: {exc}); "
                "set TUNEKIT_CACHE_DIR to a writable directory, or delete a corrupted store"
            ) from exc

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes inside are one SQLite transaction: all of them land, or (on an exception) none."""
        try:
            with self._cache.transact():
                yield
        except diskcache.Timeout:
            raise CacheError(
                f"the cache store at {self.directory} stayed locked by another process for 60 s; try again"
            ) from None

    def get(self, key: CacheKey) -> Entry | None:
        return self._decode(key.digest, self._read(key.digest))

    def put(self, entry: Entry) -> Entry:
        """Store an entry, merged with what is there (the faster best is kept). Returns the stored entry."""
        digest = entry.key.digest
        try:
            with self._cache.transact():
                old = self._decode(digest, self._read(digest))
                merged = merge_entries(old, entry) if old is not None else entry
                self._cache.set(digest, json.dumps(merged.to_json(), sort_keys=True))
        except (OSError, sqlite3.Error) as exc:
            raise CacheError(
                f"cannot write the cache store at {self.directory} ({exc.__class__.__name__}: {exc}); "
                "if it is corrupted, delete it (the tuned entries can be re-imported or re-tuned)"
            ) from exc
        except diskcache.Timeout:
            raise CacheError(
                f"the cache store at {self.directory} stayed locked by another process for 60 s; try again"
            ) from None
        return merged

    def entries(self) -> Iterator[Entry]:
        for digest in list(self._iter_keys()):
            entry = self._decode(digest, self._read(digest))
            if entry is not None:
                yield entry

    def related(self, key: CacheKey) -> list[Entry]:
        """Entries of the same kernel and problem that this key may not serve: another kernel source or device.

        Kept for reference and warm starts (the tuner tries their configs early). Same device first, then by time.
        """
        return sorted(
            (
                e
                for e in self.entries()
                if e.key.kernel == key.kernel and e.key.problem == key.problem and e.key.digest != key.digest
            ),
            key=lambda e: (e.key.device_key != key.device_key, e.time_ms, e.key.digest),
        )

    def __len__(self) -> int:
        return sum(1 for _ in self._iter_keys())

    def _unreadable(self, exc: BaseException) -> None:
        _warn_once(
            str(self.directory),
            "unreadable",
            f"tunekit: the cache store at {self.directory} is unreadable ({exc.__class__.__name__}: {exc}); "
            "its entries are ignored (dispatch falls back to shipped databases and defaults). Delete the "
            "directory or set TUNEKIT_CACHE_DIR elsewhere to start a fresh store.",
        )

    def _iter_keys(self) -> Iterator[str]:
        keys: list[str] = []
        try:
            keys = [k for k in self._cache.iterkeys() if isinstance(k, str)]
        except (OSError, sqlite3.Error) as exc:
            self._unreadable(exc)
        yield from keys

    def _read(self, digest: str) -> object:
        try:
            return self._cache.get(digest)
        except Exception as exc:  # a corrupted row can fail in diskcache's decoding in any way
            self._unreadable(exc)
            return None

    def _decode(self, digest: str, raw: object) -> Entry | None:
        """A payload that is unreadable, foreign or outside its kernel's space is skipped: never served."""
        if raw is None:
            return None
        entry, reason, why = _parse(digest, raw)
        if entry is None:
            _warn_once(
                digest,
                reason,
                f"tunekit: skipping cache entry {digest} in {self.directory}: {why}. It is never served; "
                "re-tuning or importing the problem replaces it.",
            )
        return entry


def _parse(digest: str, raw: object) -> tuple[Entry | None, str, str]:
    """(entry, "", "") or (None, reason, why)."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return None, "corrupted", "not a JSON object (a corrupted or truncated payload)"
    key = data.get("key")
    schema = key.get("schema") if isinstance(key, dict) else None
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
        why = f"written by a newer tunekit (schema {schema}; this one reads {SCHEMA_VERSION}): upgrade tunekit"
        return None, "newer-schema", why
    problem = _structure_problem(data)
    if problem is not None:
        return None, "malformed", problem
    entry = Entry.from_json(data)
    if entry.key.digest != digest:
        return None, "foreign", "it is stored under another key's digest"
    problem = _space_problem(entry)
    if problem is not None:
        return None, "outside-space", problem
    return entry, "", ""


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, bool)) or (isinstance(value, int) and abs(value) < 2**53)


def _structure_problem(data: dict[str, Any]) -> str | None:
    """Why this payload is not a well-formed entry of this schema, or None. Needs no kernel spec."""
    key, best, trials = data.get("key"), data.get("best"), data.get("trials", [])
    if not isinstance(key, dict) or key.get("schema") != SCHEMA_VERSION or isinstance(key.get("schema"), bool):
        return f"its key is missing or not of schema {SCHEMA_VERSION}"
    if not all(isinstance(key.get(f), str) for f in ("kernel", "source_hash", "device_key")):
        return "its key's kernel, source_hash and device_key must be strings"
    problem = key.get("problem")
    if not isinstance(problem, dict) or not all(_is_scalar(v) for v in problem.values()):
        return "its key's problem must map names to strings, bools or ints"
    if not isinstance(best, dict) or not _is_config(best.get("config")):
        return "its best config must map names to strings, bools or ints"
    t = best.get("time_ms")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        return f"its best time must be a finite number >= 0, but is {t!r}"
    if not isinstance(data.get("device"), dict) or not isinstance(data.get("provenance"), dict):
        return "its device and provenance must be objects"
    if not isinstance(trials, list):
        return "its trials must be a list"
    for trial in trials:
        if not isinstance(trial, dict) or trial.get("status") not in TRIAL_STATUSES:
            return "a trial is not {config, status, time_ms, error}"
        if not _is_config(trial.get("config")):
            return "a trial is not {config, status, time_ms, error}"
        tt = trial.get("time_ms")
        if tt is not None and (isinstance(tt, bool) or not isinstance(tt, (int, float))):
            return "a trial's time_ms must be a number or null"
    return None


def _is_config(config: Any) -> bool:
    return isinstance(config, dict) and all(isinstance(k, str) and _is_scalar(v) for k, v in config.items())


def _space_problem(entry: Entry) -> str | None:
    """For an entry of the kernel's current source: its problem fields and best config must fit the spec.

    Only checked when the kernel's spec is already loaded (the store never imports kernels by itself); entries of
    another source may legitimately predate today's space and are served by nobody anyway.
    """
    spec = registry._loaded.get(entry.key.kernel)
    if spec is None or entry.key.source_hash != spec.source_hash:
        return None
    if sorted(dict(entry.key.problem)) != sorted(spec.problem_fields):
        return f"its problem fields are not {sorted(spec.problem_fields)}"
    try:
        spec.space.check_membership(entry.config)
    except TunekitError as exc:
        return f"its best config is outside the {spec.name} space ({exc})"
    return None
