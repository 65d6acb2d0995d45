"""The working cache store: one SQLite file of JSON payloads keyed by the hashed CacheKey, under the user cache dir.

What it promises (tests/store/test_store.py, test_cache_integrity.py, test_concurrency.py, test_crafted_store.py):
- Everything read from disk is data. A payload is JSON text, parsed and validated, never unpickled; no row names a
  file, so nothing the store holds can make it open, write or delete a path. The store is plain sqlite3, one table
  of (digest, stored_at, payload), not diskcache (which unpickles rows whose mode says so, trusts the file names
  rows hold and applies its Settings rows as pragmas): an old diskcache `cache.db` beside it is never opened.
- Before any connection the database file and its journal names are checked with lstat: each is absent or a
  regular file with one link (never a FIFO, which would hang the open, a device, a directory or a symlink or hard
  link, through which a write would reach a file outside the store); the database is in rollback-journal mode
  (tunekit never uses WAL, whose -wal and -shm files SQLite would open too) and holds only tunekit's table.
- Check and use are the same file: a write opens (and creates) the database itself with O_NOFOLLOW, checks that
  descriptor, lets SQLite open it without creating, and writes nothing unless SQLite's write lock is on that
  descriptor's file (file_safety.holds_write_lock). A swap for a symlink in between writes nothing anywhere.
- The nearest-entry scan reads one kernel's entries on one device (`scope_entries`: selected by SQLite, kept
  without their trials until the file changes), so its cost grows with what is relevant, not with the store.
- Many processes may read and write at once: `put` is a read-merge-write inside one write transaction
  (BEGIN IMMEDIATE), so no concurrent writer's trials are lost and the faster best is kept per key. Waits for a lock
  are bounded (60 s), then a CacheError says so.
- Reads open the database read-only (`mode=ro`) and never create a file, so a store on a read-only mount or a full
  disk still serves its entries. (SQLite's WAL mode cannot promise that: a WAL reader must create the -shm file.)
- Nothing wrong is served: a row whose key or payload is not text, a payload that is too large, does not parse,
  does not match its key, was written by a newer schema, or (for the kernel's current source) names fields or values
  outside the kernel's space is skipped with one warning naming the reason, as if absent.
- Reading never raises: a store whose file is corrupted, truncated or refused yields nothing (one warning saying
  where and why), so dispatch falls back to the next layer. Opening such a store, and writing to any store that
  cannot take the write (read-only, full disk, locked, corrupted), raise CacheError with a one-line message; only
  a store that is damaged is ever called so.
- Size is unbounded unless TUNEKIT_CACHE_MAX_MB is set; then the least recently stored entries are evicted after a
  write that goes past the cap, and a warning says how many.

The file and schema checks are tunekit.store.file_safety's, payload validation tunekit.store.payload's, and the
one-line causes of errors tunekit.store.diagnosis's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from tunekit.core import settings
from tunekit.core.errors import CacheError
from tunekit.store.diagnosis import READONLY, explain, primary_code
from tunekit.store.entry import Entry, merge_entries
from tunekit.store.file_safety import (
    DB_NAME,
    TABLE_SQL,
    Refused,
    check_files,
    has_table,
    holds_write_lock,
    open_checked,
    read_regular,
)
from tunekit.store.key import CacheKey
from tunekit.store.payload import parse_payload

logger = logging.getLogger("tunekit")

LEGACY_NAME = "cache.db"  # the diskcache store of earlier versions: never opened
# The store's limits, read from this module at each use (tests lower them here): what reads them stays here.
TIMEOUT_S = 60.0  # the longest wait for another process's lock
MAX_PAYLOAD_CHARS = 16 * 2**20  # a larger payload is skipped unread (tunekit's largest are well under 1 MiB)
# The nearest-entry scan reads rows up to 1 MiB (a few thousand trials; a tuning run writes hundreds): a larger row
# is skipped there (still served by its own key), so it parses at most 1 MiB of JSON per row of its scope.
MAX_SCOPE_PAYLOAD_CHARS = 2**20

_warned: set[tuple[str, str]] = set()  # (store directory or digest, reason): each said once per process


def _warn_once(what: str, reason: str, message: str) -> None:
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        logger.warning("%s", message)


class _Skip:
    """A row's payload that is never loaded: not text, or too large."""

    def __init__(self, kind: str) -> None:
        self.reason = "not-text" if kind != "text" else "too-large"
        self.why = (
            f"its payload is {kind}, not JSON text"
            if kind != "text"
            else f"its payload is over {MAX_PAYLOAD_CHARS} characters, larger than any tunekit writes"
        )


class Store:
    """Entries by key. Safe for many processes: every write is a read-merge-write in one transaction."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else settings.cache_dir()
        self.path = self.directory / DB_NAME
        self._conn: sqlite3.Connection | None = None  # the write connection, inside `transaction`
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._reader():  # a store that cannot be read is said now, in one line
                pass
        except (Refused, OSError, sqlite3.Error) as exc:
            why = explain(exc, False, TIMEOUT_S)
            raise CacheError(f"cannot open the cache store at {self.directory}: {why}") from None
        if os.path.lexists(self.directory / LEGACY_NAME) and not os.path.lexists(self.path):
            _warn_once(
                str(self.directory),
                "legacy",
                f"tunekit: {self.directory / LEGACY_NAME} was written by an older tunekit (diskcache) and is never "
                "read (a crafted one could run code); its entries are not served. To keep them, `tunekit export` "
                "them with the older version and `tunekit import` the file.",
            )

    def close(self) -> None:
        """Nothing stays open between calls: every read and write opens its own connection."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes inside are one SQLite transaction: all of them land, or (on an exception) none. Reads inside see
        them. Nested calls join the outer transaction."""
        with self._writer():
            yield

    @contextlib.contextmanager
    def _writer(self) -> Iterator[sqlite3.Connection]:
        """The connection of this store's write transaction (BEGIN IMMEDIATE), begun here unless one is open."""
        if self._conn is not None:
            yield self._conn
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._write_transaction() as conn:
                if not has_table(conn):
                    conn.execute(TABLE_SQL)
                self._conn = conn
                yield conn
                conn.execute("COMMIT")
                _SCOPES.pop(self.path, None)
        except (Refused, OSError, sqlite3.Error) as exc:
            why = explain(exc, True, TIMEOUT_S)
            raise CacheError(f"cannot write the cache store at {self.directory}: {why}") from None
        finally:
            self._conn = None

    @contextlib.contextmanager
    def _write_transaction(self) -> Iterator[sqlite3.Connection]:
        """A connection inside BEGIN IMMEDIATE on the very file that was checked (see file_safety); closed after,
        which rolls back what was not committed."""
        check_files(self.path)
        fd = open_checked(self.path, write=True)
        assert fd is not None  # a write creates the file
        try:
            with contextlib.closing(_connect(self.path, read_only=False)) as conn:
                conn.execute("BEGIN IMMEDIATE")
                if not holds_write_lock(fd):  # SQLite opened another file than the one checked: write nothing
                    raise Refused(f"{self.path} was replaced while it was opened (by a symlink or another file)")
                conn.execute("PRAGMA journal_mode = DELETE")
                yield conn
        finally:
            os.close(fd)

    def get(self, key: CacheKey) -> Entry | None:
        for digest, raw in self._rows(key.digest):
            return self._decode(digest, raw)
        return None

    def put(self, entry: Entry) -> Entry:
        """Store an entry, merged with what is there (the faster best is kept). Returns the stored entry."""
        digest = entry.key.digest
        with self._writer() as conn:
            old = self.get(entry.key)
            merged = merge_entries(old, entry) if old is not None else entry
            payload = json.dumps(merged.to_json(), sort_keys=True)
            conn.execute(
                "INSERT OR REPLACE INTO entries (digest, stored_at, payload) VALUES (?, ?, ?)",
                (digest, time.time(), payload),
            )
            self._evict(conn, keep=digest)
        return merged

    def delete(self, digest: str) -> bool:
        """Remove the row under `digest`, readable or not; True when a row was removed. Joins a transaction."""
        with self._writer() as conn:
            return conn.execute("DELETE FROM entries WHERE digest = ?", (digest,)).rowcount > 0

    def entries(self) -> Iterator[Entry]:
        yield from self._decoded(self._rows(None))

    def _decoded(self, rows: list[tuple[Any, Any]]) -> list[Entry]:
        found: list[Entry] = []
        seen: set[str] = set()
        for digest, raw in rows:
            entry = self._decode(digest, raw) if digest not in seen else None
            if entry is not None:
                seen.add(digest)
                found.append(entry)
        return found

    def scope_entries(self, kernel: str, device_key: str) -> list[Entry]:
        """The readable entries of one kernel on one device, kept without their trials: what the nearest-entry
        scan looks at. SQLite selects the rows (up to MAX_SCOPE_PAYLOAD_CHARS) by the key their payload holds
        before any is decoded, each is validated as every read validates it, and the result is kept until the
        database file changes: the cost grows with what is relevant, not with the store (an import of 20k
        entries for another device costs a new key nothing here)."""
        if self._conn is not None:  # inside a transaction: its own writes, uncached
            return self._decoded(self._rows(None, (kernel, device_key)))
        signature = _file_signature(self.path)
        cached = _SCOPES.get(self.path)
        if cached is None or cached[0] != signature:
            cached = _SCOPES[self.path] = (signature, {})
        scoped = cached[1].get((kernel, device_key))
        if scoped is None:
            rows = self._rows(None, (kernel, device_key))
            scoped = cached[1][(kernel, device_key)] = [replace(e, trials=()) for e in self._decoded(rows)]
        return list(scoped)

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
        """Rows in the store, valid or not."""
        try:
            with self._reader() as conn:
                return int(conn.execute("SELECT count(*) FROM entries").fetchone()[0]) if conn is not None else 0
        except (Refused, OSError, sqlite3.Error) as exc:
            self._unreadable(exc)
            return 0

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection | None]:
        """A read-only connection to a store that holds tunekit's table; None while there is none (nothing stored).
        Inside a transaction, its own connection (a read sees the transaction's writes)."""
        if self._conn is not None:
            yield self._conn
            return
        if not check_files(self.path):
            yield None
            return
        conn = _connect(self.path, read_only=True)
        try:
            try:
                holds_table = has_table(conn)
            except sqlite3.OperationalError as exc:
                if primary_code(exc) != READONLY:
                    raise
                # A writer was killed mid-write (SQLITE_READONLY_ROLLBACK): its journal must be rolled back, which a
                # read-only connection cannot do. A write transaction does it (not on a read-only mount).
                with self._write_transaction():
                    pass
                holds_table = has_table(conn)
            yield conn if holds_table else None
        finally:
            conn.close()

    def _rows(self, digest: str | None, scope: tuple[str, str] | None = None) -> list[tuple[Any, Any]]:
        """(digest, payload) rows: every row, those of one digest, or (`scope`: kernel, device key) the rows of at
        most MAX_SCOPE_PAYLOAD_CHARS whose payload is valid JSON with that key. A payload that is not text, or is
        too large to be tunekit's, is returned as a _Skip (never loaded). All rows are read before any is decoded,
        so no read stays open while a caller writes."""
        readable = f"typeof(payload) = 'text' AND length(payload) <= {MAX_PAYLOAD_CHARS}"
        query = f"SELECT digest, typeof(payload), CASE WHEN {readable} THEN payload END FROM entries"
        args: tuple[str, ...] = ()
        if digest is not None:
            query, args = query + " WHERE digest = ?", (digest,)
        elif scope is not None:
            query = (
                "SELECT digest, 'text', payload FROM entries WHERE "
                f"CASE WHEN typeof(payload) = 'text' AND length(payload) <= {MAX_SCOPE_PAYLOAD_CHARS} "
                "AND json_valid(payload) THEN json_extract(payload, '$.key.kernel') = ? "
                "AND json_extract(payload, '$.key.device_key') = ? ELSE 0 END"
            )
            args = scope
        try:
            with self._reader() as conn:
                if conn is None:
                    return []
                rows = conn.execute(query, args).fetchall()
        except (Refused, OSError, sqlite3.Error) as exc:
            self._unreadable(exc)
            return []
        return [(d, text if text is not None else _Skip(kind)) for d, kind, text in rows]

    def _evict(self, conn: sqlite3.Connection, keep: str) -> None:
        """With TUNEKIT_CACHE_MAX_MB set: while the store's used pages exceed the cap, delete the least recently
        stored entry (never `keep`, the one just written). Said in a warning."""
        cap = settings.cache_max_bytes()
        if cap is None or _used_bytes(conn) <= cap:
            return
        oldest = [d for (d,) in conn.execute("SELECT digest FROM entries ORDER BY stored_at, digest") if d != keep]
        evicted = 0
        for d in oldest:
            if _used_bytes(conn) <= cap:
                break
            conn.execute("DELETE FROM entries WHERE digest = ?", (d,))
            evicted += 1
        logger.warning(
            "tunekit: the cache store at %s went past TUNEKIT_CACHE_MAX_MB=%d: evicted %d entr%s, the least "
            "recently stored (re-tuning or importing brings them back)",
            self.directory,
            cap // 10**6,
            evicted,
            "y" if evicted == 1 else "ies",
        )

    def _unreadable(self, exc: BaseException) -> None:
        _warn_once(
            str(self.directory),
            "unreadable",
            f"tunekit: the cache store at {self.directory} is unreadable: {explain(exc, False, TIMEOUT_S)}. Its "
            "entries are ignored (dispatch falls back to shipped databases and defaults).",
        )

    def _decode(self, digest: object, raw: object) -> Entry | None:
        """A payload that is unreadable, foreign or outside its kernel's space is skipped: never served."""
        if raw is None:
            return None
        if not isinstance(digest, str):
            entry, reason, why = None, "not-text-key", "its key is not text"
        elif isinstance(raw, _Skip):
            entry, reason, why = None, raw.reason, raw.why
        else:
            entry, reason, why = parse_payload(digest, raw)
        if entry is None:
            _warn_once(
                digest if isinstance(digest, str) else str(self.directory),
                reason,
                f"tunekit: skipping cache entry {digest!r:.40} in {self.directory}: {why}. It is never served; "
                "re-tuning or importing the problem replaces it.",
            )
        return entry


# Per database file: (its signature when read, {(kernel, device key): entries without trials}).
_SCOPES: dict[Path, tuple[tuple[int, ...] | None, dict[tuple[str, str], list[Entry]]]] = {}


def _file_signature(path: Path) -> tuple[int, ...] | None:
    """What changes when the database file is written (by any process): its device, inode, size and times, and
    SQLite's file change counter (header bytes 24-27, incremented by every committed write transaction)."""
    try:
        st = os.lstat(path)
        counter = read_regular(str(path), 24, 4)
    except (OSError, Refused):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, int.from_bytes(counter, "big"))


def _connect(path: Path, read_only: bool) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit); read-only ones open with `mode=ro`, writing
    ones with `mode=rw` (the file is created by `open_checked`, never by SQLite)."""
    uri = f"{path.absolute().as_uri()}?mode={'ro' if read_only else 'rw'}"  # never creates: the store does
    conn = sqlite3.connect(uri, uri=True, timeout=TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA cell_size_check = ON")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _used_bytes(conn: sqlite3.Connection) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])
