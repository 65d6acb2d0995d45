"""Helpers that craft cache stores the way an attacker or an accident would: raw rows, a writer killed mid-write,
a super-journal record, a private tmpfs (full or read-only). Used by test_store, test_cache_integrity,
test_concurrency and test_crafted_store."""

from __future__ import annotations

import functools
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from tunekit.store.store import DB_NAME, Store

JOURNAL_MAGIC = bytes((0xD9, 0xD5, 0x05, 0xF9, 0x20, 0xA1, 0x63, 0xD7))
ROOT = Path(__file__).resolve().parent.parent


def plant(digest: object, payload: object, directory: Path | None = None, stored_at: object = 0.0) -> None:
    """Write one raw row into the store's table, as a crafted or damaged store would hold it."""
    with Store(directory)._writer() as conn:
        conn.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", (digest, stored_at, payload))


def raw_rows(directory: Path | None = None) -> dict[object, object]:
    """Every (digest, payload) row, read with plain sqlite3."""
    path = (directory or Store().directory) / DB_NAME
    with sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True) as conn:
        return dict(conn.execute("SELECT digest, payload FROM entries").fetchall())


KILLED_WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 1")  # spill: the journal and the database file are both written mid-transaction
conn.execute("BEGIN IMMEDIATE")
for i in range(3000):
    conn.execute("INSERT INTO entries VALUES (?, 0, ?)", (f"junk{i}", "x" * 200))
os.kill(os.getpid(), signal.SIGKILL)
"""


def leave_hot_journal(directory: Path) -> Path:
    """SIGKILL a writer of the store in the middle of a large transaction: its journal stays behind, hot (the next
    writer must roll it back). The store must exist. Returns the journal's path."""
    path = directory / DB_NAME
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], check=False, timeout=60)
    journal = Path(f"{path}-journal")
    assert journal.exists() and journal.stat().st_size > 0
    return journal


def name_super_journal(journal: Path, target: Path) -> None:
    """Append a super-journal record naming `target`: SQLite, rolling the journal back, would open `target` and
    delete it (it does so for a real multi-database commit; tunekit never makes one)."""
    name = os.fsencode(target)
    lock_page = 0x40000000 // 4096 + 1
    with journal.open("ab") as f:
        f.write(struct.pack(">I", lock_page) + name + struct.pack(">II", len(name), sum(name)) + JOURNAL_MAGIC)


@functools.lru_cache(maxsize=1)
def private_tmpfs_available() -> bool:
    """Whether this process may mount a tmpfs in a private mount namespace (root or user namespaces)."""
    if not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"],
            capture_output=True,
            timeout=30,
        )
        return probe.returncode == 0


def run_in_tmpfs(mountpoint: Path, size_kib: int, body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run python `body` in a private mount namespace where `mountpoint` is a fresh tmpfs of `size_kib` KiB
    (nothing outside this process tree sees it). `body` may call remount_ro() and fill_disk(); it runs with
    MNT (a Path) and the tests directory on sys.path."""
    script = textwrap.dedent(
        f"""
            import os, subprocess, sys
            from pathlib import Path
            sys.path.insert(0, {str(ROOT / "tests")!r})
            MNT = Path({str(mountpoint)!r})
            def remount_ro():
                subprocess.run(["mount", "-o", "remount,ro", str(MNT)], check=True)
            def fill_disk():
                fd = os.open(MNT / "filler", os.O_WRONLY | os.O_CREAT)
                try:
                    while True:
                        os.write(fd, bytes(4096))
                except OSError:
                    pass
                finally:
                    os.close(fd)
            """
    ) + textwrap.dedent(body)
    mountpoint.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount -t tmpfs -o size={size_kib}k tmpfs "$0" && exec "$1" -c "$2"',
            str(mountpoint),
            sys.executable,
            script,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
