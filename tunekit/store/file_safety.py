"""What the store lets SQLite open: its database file, the journals beside it and its schema, checked to be tunekit's.

A crafted cache directory must never make SQLite reach a file outside the store, block, or run SQL of its own: each
file is absent or a regular file with one link, the database is in rollback-journal mode (never WAL), a journal
names no super-journal, and the schema holds tunekit's table only. Nothing here opens a connection.

Check and use are the same object: the store opens the database file itself (`open_checked`: O_NOFOLLOW, created
so for a write, so SQLite never creates it), checks that descriptor, and once SQLite holds its write lock asks the
kernel whether the lock is on that descriptor's file (`holds_write_lock`). A file swapped for a symlink or another
file in between is refused before anything is written.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import struct
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

DB_NAME = "store.sqlite3"  # the store's database, in its directory
TABLE_SQL = "CREATE TABLE entries (digest TEXT PRIMARY KEY, stored_at REAL NOT NULL, payload TEXT NOT NULL)"
_SCHEMA = {("table", "entries", TABLE_SQL), ("index", "sqlite_autoindex_entries_1", None)}
_JOURNALS = ("-journal", "-wal", "-shm")
_HEADER = b"SQLite format 3\x00"
_JOURNAL_MAGIC = bytes((0xD9, 0xD5, 0x05, 0xF9, 0x20, 0xA1, 0x63, 0xD7))  # begins a journal header, ends a super record


class Refused(Exception):
    """The store's file, or a file SQLite would open beside it, is not what tunekit writes: never opened."""


def check_files(path: Path) -> bool:
    """Whether the database file exists. Raises Refused when it, or a file SQLite would open beside it, is not
    what tunekit writes (see the module's docstring). Opens nothing that could block: lstat, then O_NONBLOCK."""
    exists = False
    for suffix in ("", *_JOURNALS):
        name = f"{path}{suffix}"
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{name} is {file_kind(st.st_mode)}, not a regular file")
        if st.st_nlink == 0 and suffix == "-journal":
            continue  # another writer's journal, unlinked as we looked (its transaction just ended)
        if st.st_nlink != 1:
            raise Refused(f"{name} has {st.st_nlink} hard links (tunekit's files have one)")
        if suffix in ("-wal", "-shm"):
            raise Refused(f"{name} exists, but tunekit's store never uses SQLite's WAL mode")
        exists = exists or suffix == ""
    if not exists:
        return False
    _check_header(path, read_regular(str(path), 0, 100))
    # A journal left by an interrupted write is rolled back by the next writer. One that ends in a super-journal
    # record names another file, which SQLite would then open and delete: tunekit never writes one.
    tail = read_regular(f"{path}-journal", -16, 16)
    if len(tail) == 16 and tail[8:] == _JOURNAL_MAGIC:
        raise Refused(f"{path}-journal names a super-journal (another file), which tunekit never writes")
    return True


def _check_header(path: Path, header: bytes) -> None:
    if header and (len(header) < 100 or not header.startswith(_HEADER)):
        raise Refused(f"{path} is not an SQLite database (damaged, or not written by tunekit)")
    if header and header[18:20] != b"\x01\x01":
        raise Refused(f"{path} is in SQLite's WAL mode, which tunekit's store never uses")


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def open_checked(path: Path, write: bool) -> int | None:
    """A descriptor of the database file, never through a symlink: for a write opened read-write and created if
    absent (so SQLite, told never to create it, cannot create one where a link points), for a read None when
    absent. Raises Refused unless it is a regular file with one link holding an SQLite rollback-journal database
    (or nothing yet). The caller closes it."""
    flags = (os.O_RDWR | os.O_CREAT if write else os.O_RDONLY) | _NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if write:
            raise
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise Refused(f"{path} is a symlink, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is {file_kind(st.st_mode)}, not a regular file")
        if st.st_nlink != 1:
            raise Refused(f"{path} has {st.st_nlink} hard links (tunekit's files have one)")
        _check_header(path, os.pread(fd, 100, 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


_RESERVED_BYTE = 0x40000001  # SQLite's RESERVED lock (PENDING_BYTE + 1), held by one connection in BEGIN IMMEDIATE
_FLOCK = "hhxxxxqqixxxx"  # struct flock on Linux (64-bit off_t): type, whence, start, len, pid


def holds_write_lock(fd: int) -> bool:
    """Whether this process holds SQLite's write (RESERVED) lock on the file of `fd`: asked with an open file
    description lock query, which conflicts with the process's own POSIX locks (SQLite's) on that file only.
    Where the kernel has no such query (not Linux), True: the symlink and link checks are what remains."""
    query = getattr(fcntl, "F_OFD_GETLK", None)
    if query is None:
        return True
    request = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, _RESERVED_BYTE, 1, 0)
    kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, query, request))
    return kind != fcntl.F_UNLCK and pid == os.getpid()


def read_regular(name: str, offset: int, size: int) -> bytes:
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
            raise Refused(f"{name} is {file_kind(st.st_mode)}, not a regular file")
        start = offset if offset >= 0 else st.st_size + offset
        return os.pread(fd, size, start) if start >= 0 else b""
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What a file of this mode is, as an error names it ("a FIFO")."""
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


def has_table(conn: sqlite3.Connection) -> bool:
    """Whether tunekit's table exists (False: an empty database). Raises Refused when the schema holds anything
    else (other tables, views, triggers): a crafted schema could make our statements run its SQL."""
    found = set(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
    if found and found != _SCHEMA:
        raise Refused("its database holds tables, views or triggers that tunekit never writes")
    return bool(found)
