"""The working cache store: diskcache under the user cache dir, JSON payloads keyed by the hashed CacheKey."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import diskcache

from tunekit import settings
from tunekit.cache_key import SCHEMA_VERSION, CacheKey
from tunekit.entry import Entry, merge_entries
from tunekit.errors import CacheError

logger = logging.getLogger("tunekit")


class Store:
    """Entries by key. Safe for many processes: every write is a read-merge-write in one transaction."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else settings.cache_dir()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(str(self.directory), timeout=60)
        except (OSError, sqlite3.Error) as exc:
            raise CacheError(
                f"cannot open the cache store at {self.directory} ({exc.__class__.__name__}: {exc}); "
                "set TUNEKIT_CACHE_DIR to a writable directory"
            ) from exc

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, key: CacheKey) -> Entry | None:
        return self._decode(key.digest, self._read(key.digest))

    def put(self, entry: Entry) -> Entry:
        """Store an entry, merged with what is there (the faster best is kept). Returns the stored entry."""
        digest = entry.key.digest
        try:
            with self._cache.transact():
                old = self._decode(digest, self._cache.get(digest))
                merged = merge_entries(old, entry) if old is not None else entry
                self._cache.set(digest, json.dumps(merged.to_json(), sort_keys=True))
        except (OSError, sqlite3.Error) as exc:
            raise CacheError(f"cannot write the cache store at {self.directory}: {exc}") from exc
        return merged

    def entries(self) -> Iterator[Entry]:
        for digest in list(self._iter_keys()):
            entry = self._decode(digest, self._read(digest))
            if entry is not None:
                yield entry

    def __len__(self) -> int:
        return sum(1 for _ in self._iter_keys())

    def _iter_keys(self) -> Iterator[str]:
        try:
            yield from (k for k in self._cache.iterkeys() if isinstance(k, str))
        except sqlite3.Error as exc:
            raise CacheError(f"cannot read the cache store at {self.directory}: {exc}") from exc

    def _read(self, digest: str) -> object:
        try:
            return self._cache.get(digest)
        except (OSError, sqlite3.Error) as exc:
            raise CacheError(f"cannot read the cache store at {self.directory}: {exc}") from exc

    def _decode(self, digest: str, raw: object) -> Entry | None:
        """A payload that fails to parse, or that a newer schema wrote, is skipped: never served."""
        if raw is None:
            return None
        try:
            data = json.loads(raw) if isinstance(raw, str) else None
            entry = Entry.from_json(data) if isinstance(data, dict) else None
        except (ValueError, KeyError, TypeError, AttributeError):
            entry = None
        if entry is None or entry.key.digest != digest or entry.key.schema != SCHEMA_VERSION:
            logger.warning("tunekit: skipping an unreadable or foreign-schema cache entry %s", digest)
            return None
        return entry
