"""What the store lets SQLite open: its database file, the journals beside it and its schema, checked to be tunekit's.

A crafted cache directory must never make SQLite reach a file outside the store, block, or run SQL of its own: each
file is absent or a regular file with one link, the database is in rollback-journal mode (never WAL), a journal
names no super-journal, and the schema holds tunekit's table only. Nothing here opens a connection.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

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
            raise Refused(f"{name} is {_kind(st.st_mode)}, not a regular file")
        if st.st_nlink == 0 and suffix == "-journal":
            continue  # another writer's journal, unlinked as we looked (its transaction just ended)
        if st.st_nlink != 1:
            raise Refused(f"{name} has {st.st_nlink} hard links (tunekit's files have one)")
        if suffix in ("-wal", "-shm"):
            raise Refused(f"{name} exists, but tunekit's store never uses SQLite's WAL mode")
        exists = exists or suffix == ""
    if not exists:
        return False
    header = _read_regular(str(path), 0, 100)
    if header and (len(header) < 100 or not header.startswith(_HEADER)):
        raise Refused(f"{path} is not an SQLite database (damaged, or not written by tunekit)")
    if header and header[18:20] != b"\x01\x01":
        raise Refused(f"{path} is in SQLite's WAL mode, which tunekit's store never uses")
    # A journal left by an interrupted write is rolled back by the next writer. One that ends in a super-journal
    # record names another file, which SQLite would then open and delete: tunekit never writes one.
    tail = _read_regular(f"{path}-journal", -16, 16)
    if len(tail) == 16 and tail[8:] == _JOURNAL_MAGIC:
        raise Refused(f"{path}-journal names a super-journal (another file), which tunekit never writes")
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
            raise Refused(f"{name} is {_kind(st.st_mode)}, not a regular file")
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


def has_table(conn: sqlite3.Connection) -> bool:
    """Whether tunekit's table exists (False: an empty database). Raises Refused when the schema holds anything
    else (other tables, views, triggers): a crafted schema could make our statements run its SQL."""
    found = set(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
    if found and found != _SCHEMA:
        raise Refused("its database holds tables, views or triggers that tunekit never writes")
    return bool(found)
