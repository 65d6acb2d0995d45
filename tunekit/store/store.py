"""The working cache store: one SQLite file of JSON payloads keyed by the hashed CacheKey, under the user cache dir.

What it promises (tests/test_store.py, test_cache_integrity.py, test_concurrency.py, test_crafted_store.py):
- Everything read from disk is data. A payload is JSON text, parsed and validated, never unpickled; no row names a
  file, so nothing the store holds can make it open, write or delete a path. The store is plain sqlite3, one table
  of (digest, stored_at, payload), not diskcache (which unpickles rows whose mode says so, trusts the file names
  rows hold and applies its Settings rows as pragmas): an old diskcache `cache.db` beside it is never opened.
- Before any connection the database file and its journal names are checked with lstat: each is absent or a
  regular file with one link (never a FIFO, which would hang the open, a device, a directory or a symlink or hard
  link, through which a write would reach a file outside the store); the database is in rollback-journal mode
  (tunekit never uses WAL, whose -wal and -shm files SQLite would open too) and holds only tunekit's table.
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
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunekit.core import registry, settings
from tunekit.core.errors import CacheError, TunekitError
from tunekit.store.entry import TRIAL_STATUSES, Entry, merge_entries
from tunekit.store.key import SCHEMA_VERSION, CacheKey

logger = logging.getLogger("tunekit")

DB_NAME = "store.sqlite3"
LEGACY_NAME = "cache.db"  # the diskcache store of earlier versions: never opened
TIMEOUT_S = 60.0  # the longest wait for another process's lock
MAX_PAYLOAD_CHARS = 16 * 2**20  # a larger payload is skipped unread (tunekit's largest are well under 1 MiB)
_TABLE_SQL = "CREATE TABLE entries (digest TEXT PRIMARY KEY, stored_at REAL NOT NULL, payload TEXT NOT NULL)"
_SCHEMA = {("table", "entries", _TABLE_SQL), ("index", "sqlite_autoindex_entries_1", None)}
_JOURNALS = ("-journal", "-wal", "-shm")
_HEADER = b"SQLite format 3\x00"
_JOURNAL_MAGIC = bytes((0xD9, 0xD5, 0x05, 0xF9, 0x20, 0xA1, 0x63, 0xD7))  # begins a journal header, ends a super record
# SQLite result codes (primary, and the one extended code we act on)
_BUSY, _READONLY, _CORRUPT, _FULL, _NOTADB = 5, 8, 11, 13, 26  # SQLite's primary result codes

_warned: set[tuple[str, str]] = set()  # (store directory or digest, reason): each said once per process


def _warn_once(what: str, reason: str, message: str) -> None:
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        logger.warning("%s", message)


class _Refused(Exception):
    """The store's file, or a file SQLite would open beside it, is not what tunekit writes: never opened."""


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
        except (_Refused, OSError, sqlite3.Error) as exc:
            raise CacheError(f"cannot open the cache store at {self.directory}: {_explain(exc, False)}") from None
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
        conn: sqlite3.Connection | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _check_files(self.path)
            conn = _connect(self.path, read_only=False)
            conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("BEGIN IMMEDIATE")
            if not _has_table(conn):
                conn.execute(_TABLE_SQL)
            self._conn = conn
            yield conn
            conn.execute("COMMIT")
        except (_Refused, OSError, sqlite3.Error) as exc:
            raise CacheError(f"cannot write the cache store at {self.directory}: {_explain(exc, True)}") from None
        finally:
            self._conn = None
            if conn is not None:
                conn.close()  # without COMMIT, SQLite rolls the transaction back

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
        seen: set[str] = set()
        for digest, raw in self._rows(None):
            entry = self._decode(digest, raw) if digest not in seen else None
            if entry is not None:
                seen.add(digest)
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
        """Rows in the store, valid or not."""
        try:
            with self._reader() as conn:
                return int(conn.execute("SELECT count(*) FROM entries").fetchone()[0]) if conn is not None else 0
        except (_Refused, OSError, sqlite3.Error) as exc:
            self._unreadable(exc)
            return 0

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection | None]:
        """A read-only connection to a store that holds tunekit's table; None while there is none (nothing stored).
        Inside a transaction, its own connection (a read sees the transaction's writes)."""
        if self._conn is not None:
            yield self._conn
            return
        if not _check_files(self.path):
            yield None
            return
        conn = _connect(self.path, read_only=True)
        try:
            try:
                has_table = _has_table(conn)
            except sqlite3.OperationalError as exc:
                if _primary_code(exc) != _READONLY:
                    raise
                # A writer was killed mid-write (SQLITE_READONLY_ROLLBACK): its journal must be rolled back, which a
                # read-only connection cannot do. Any read through a writable one does it (not on a read-only mount).
                with contextlib.closing(_connect(self.path, read_only=False)) as rw:
                    rw.execute("SELECT count(*) FROM sqlite_master").fetchone()
                has_table = _has_table(conn)
            yield conn if has_table else None
        finally:
            conn.close()

    def _rows(self, digest: str | None) -> list[tuple[Any, Any]]:
        """(digest, payload) rows: every row, or those of one digest. A payload that is not text, or is too large
        to be tunekit's, is returned as a _Skip (never loaded). All rows are read before any is decoded, so no
        read stays open while a caller writes."""
        query = (
            "SELECT digest, typeof(payload), "
            f"CASE WHEN typeof(payload) = 'text' AND length(payload) <= {MAX_PAYLOAD_CHARS} THEN payload END "
            "FROM entries"
        )
        try:
            with self._reader() as conn:
                if conn is None:
                    return []
                if digest is None:
                    rows = conn.execute(query).fetchall()
                else:
                    rows = conn.execute(query + " WHERE digest = ?", (digest,)).fetchall()
        except (_Refused, OSError, sqlite3.Error) as exc:
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
            f"tunekit: the cache store at {self.directory} is unreadable: {_explain(exc, False)}. Its entries are "
            "ignored (dispatch falls back to shipped databases and defaults).",
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
            entry, reason, why = _parse(digest, raw)
        if entry is None:
            _warn_once(
                digest if isinstance(digest, str) else str(self.directory),
                reason,
                f"tunekit: skipping cache entry {digest!r:.40} in {self.directory}: {why}. It is never served; "
                "re-tuning or importing the problem replaces it.",
            )
        return entry


def _connect(path: Path, read_only: bool) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit); read-only ones open with `mode=ro`."""
    uri = f"{path.absolute().as_uri()}?mode={'ro' if read_only else 'rwc'}"
    conn = sqlite3.connect(uri, uri=True, timeout=TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA cell_size_check = ON")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _check_files(path: Path) -> bool:
    """Whether the database file exists. Raises _Refused when it, or a file SQLite would open beside it, is not
    what tunekit writes (see the module's docstring). Opens nothing that could block: lstat, then O_NONBLOCK."""
    exists = False
    for suffix in ("", *_JOURNALS):
        name = f"{path}{suffix}"
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"{name} is {_kind(st.st_mode)}, not a regular file")
        if st.st_nlink != 1:
            raise _Refused(f"{name} has {st.st_nlink} hard links (tunekit's files have one)")
        if suffix in ("-wal", "-shm"):
            raise _Refused(f"{name} exists, but tunekit's store never uses SQLite's WAL mode")
        exists = exists or suffix == ""
    if not exists:
        return False
    header = _read_regular(str(path), 0, 100)
    if header and (len(header) < 100 or not header.startswith(_HEADER)):
        raise _Refused(f"{path} is not an SQLite database (damaged, or not written by tunekit)")
    if header and header[18:20] != b"\x01\x01":
        raise _Refused(f"{path} is in SQLite's WAL mode, which tunekit's store never uses")
    # A journal left by an interrupted write is rolled back by the next writer. One that ends in a super-journal
    # record names another file, which SQLite would then open and delete: tunekit never writes one.
    tail = _read_regular(f"{path}-journal", -16, 16)
    if len(tail) == 16 and tail[8:] == _JOURNAL_MAGIC:
        raise _Refused(f"{path}-journal names a super-journal (another file), which tunekit never writes")
    return True


def _read_regular(name: str, offset: int, size: int) -> bytes:
    """Up to `size` bytes at `offset` (from the end when negative) of a regular file; b"" if it is gone or shorter.
    Never follows a symlink, never blocks on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:  # a journal comes and goes with every write
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"{name} is {_kind(st.st_mode)}, not a regular file")
        start = offset if offset >= 0 else st.st_size + offset
        return os.pread(fd, size, start) if start >= 0 else b""
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"


def _has_table(conn: sqlite3.Connection) -> bool:
    """Whether tunekit's table exists (False: an empty database). Raises _Refused when the schema holds anything
    else (other tables, views, triggers): a crafted schema could make our statements run its SQL."""
    found = set(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
    if found and found != _SCHEMA:
        raise _Refused("its database holds tables, views or triggers that tunekit never writes")
    return bool(found)


def _used_bytes(conn: sqlite3.Connection) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])


def _explain(exc: BaseException, writing: bool) -> str:
    """The cause, in one line, with what to do. Only a damaged store is ever called damaged, and no message asks
    for a store to be deleted."""
    primary = _primary_code(exc)
    errno_ = exc.errno if isinstance(exc, OSError) else None
    if isinstance(exc, _Refused):
        return f"{exc}; it is not what tunekit writes: move it away or set TUNEKIT_CACHE_DIR to another directory"
    if primary == _FULL or errno_ in (errno.ENOSPC, errno.EDQUOT):
        if not writing:
            return f"the disk is full (ENOSPC: {exc}); set TUNEKIT_CACHE_DIR to a directory on another disk"
        return (
            f"the disk is full (ENOSPC: {exc}); nothing stored was lost and its entries are still served. Free "
            "space on that disk or set TUNEKIT_CACHE_DIR to a directory on another one"
        )
    if primary == _READONLY or errno_ in (errno.EROFS, errno.EACCES, errno.EPERM):
        if not writing:
            return f"permission denied ({exc}); set TUNEKIT_CACHE_DIR to a directory you can read and write"
        return (
            f"it is read-only ({exc}); its entries are still served. Set TUNEKIT_CACHE_DIR to a writable "
            "directory to store new ones"
        )
    if primary == _BUSY:
        return f"another process held its lock for more than {TIMEOUT_S:.0f} s ({exc}); try again"
    if primary in (_CORRUPT, _NOTADB):
        return (
            f"its database is damaged ({exc}); move {DB_NAME} away (its entries can be re-imported or re-tuned) "
            "or set TUNEKIT_CACHE_DIR to another directory"
        )
    return f"{exc.__class__.__name__}: {exc}; set TUNEKIT_CACHE_DIR to another directory if it persists"


def _primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of an sqlite3 error (from its message before Python 3.11)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    if not isinstance(exc, sqlite3.Error):
        return None
    text = str(exc)
    for needle, primary in (
        ("disk is full", _FULL),
        ("is locked", _BUSY),
        ("readonly", _READONLY),
        ("malformed", _CORRUPT),
        ("not a database", _NOTADB),
    ):
        if needle in text:
            return primary
    return None


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
