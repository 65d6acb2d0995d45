"""Why the store could not be read or written: SQLite's and the OS's errors told in one line, with what to do."""

from __future__ import annotations

import errno
import sqlite3

from tunekit.store.file_safety import DB_NAME, Refused

BUSY, READONLY, CORRUPT, FULL, NOTADB = 5, 8, 11, 13, 26  # SQLite's primary result codes


def explain(exc: BaseException, writing: bool, timeout_s: float) -> str:
    """The cause, in one line, with what to do (`timeout_s`: the lock wait that ran out). Only a damaged store is
    ever called damaged, and no message asks for a store to be deleted."""
    primary = primary_code(exc)
    errno_ = exc.errno if isinstance(exc, OSError) else None
    if isinstance(exc, Refused):
        return f"{exc}; it is not what tunekit writes: move it away or set TUNEKIT_CACHE_DIR to another directory"
    if primary == FULL or errno_ in (errno.ENOSPC, errno.EDQUOT):
        if not writing:
            return f"the disk is full (ENOSPC: {exc}); set TUNEKIT_CACHE_DIR to a directory on another disk"
        return (
            f"the disk is full (ENOSPC: {exc}); nothing stored was lost and its entries are still served. Free "
            "space on that disk or set TUNEKIT_CACHE_DIR to a directory on another one"
        )
    if primary == READONLY or errno_ in (errno.EROFS, errno.EACCES, errno.EPERM):
        if not writing:
            return f"permission denied ({exc}); set TUNEKIT_CACHE_DIR to a directory you can read and write"
        return (
            f"it is read-only ({exc}); its entries are still served. Set TUNEKIT_CACHE_DIR to a writable "
            "directory to store new ones"
        )
    if primary == BUSY:
        return f"another process held its lock for more than {timeout_s:.0f} s ({exc}); try again"
    if primary in (CORRUPT, NOTADB):
        return (
            f"its database is damaged ({exc}); move {DB_NAME} away (its entries can be re-imported or re-tuned) "
            "or set TUNEKIT_CACHE_DIR to another directory"
        )
    return f"{exc.__class__.__name__}: {exc}; set TUNEKIT_CACHE_DIR to another directory if it persists"


def primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of an sqlite3 error (from its message before Python 3.11)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    if not isinstance(exc, sqlite3.Error):
        return None
    text = str(exc)
    for needle, primary in (
        ("disk is full", FULL),
        ("is locked", BUSY),
        ("readonly", READONLY),
        ("malformed", CORRUPT),
        ("not a database", NOTADB),
    ):
        if needle in text:
            return primary
    return None
