from __future__ import annotations

import dataclasses
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from crafting import leave_hot_journal, name_super_journal, private_tmpfs_available, run_in_tmpfs
from fingerprints import H200
from helpers import TESTS, make_entry

from tunekit.core.device import fingerprint
from tunekit.core.errors import CacheError, TunekitError
from tunekit.store.entry import Entry
from tunekit.store.store import DB_NAME, LEGACY_NAME, Store


def test_round_trip(isolated_cache):
    entry = make_entry(fingerprint(), 1.5)
    with Store() as store:
        store.put(entry)
    with Store() as store:  # a new handle, as another process would open it
        assert store.get(entry.key) == entry
        assert len(store) == 1


def test_entries_are_separated_by_device_fingerprint():
    here, there = make_entry(fingerprint(), 1.0, block=8), make_entry(H200, 2.0, block=32)
    assert here.key.digest != there.key.digest
    with Store() as store:
        store.put(here)
        store.put(there)
        assert store.get(here.key).config["BLOCK"] == 8
        assert store.get(there.key).config["BLOCK"] == 32
    newer_triton = dataclasses.replace(H200, triton_version="3.7.0")
    assert newer_triton.key != H200.key  # a new Triton version retires the entries


def test_put_keeps_the_faster_entry_and_all_trials():
    fast, slow = make_entry(fingerprint(), 1.0, block=8), make_entry(fingerprint(), 3.0, block=32)
    with Store() as store:
        store.put(fast)
        merged = store.put(slow)
        assert merged.config["BLOCK"] == 8 and merged.time_ms == 1.0
        assert {t.config["BLOCK"] for t in merged.trials} == {8, 32}


def test_corrupted_payload_is_skipped_not_served(isolated_cache):
    from crafting import plant

    entry = make_entry(fingerprint(), 1.0)
    with Store() as store:
        store.put(entry)
        plant(entry.key.digest, "{not json")
        assert store.get(entry.key) is None
        newer = entry.to_json()
        newer["key"]["schema"] = 99
        plant(entry.key.digest, json.dumps(newer))
        assert store.get(entry.key) is None
        assert list(store.entries()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_cache_dir_is_a_clear_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    with pytest.raises(CacheError, match="TUNEKIT_CACHE_DIR"):
        Store(locked / "sub")


def test_cache_dir_that_is_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="cannot open the cache store"):
        Store(blocker)


# ------------------------------------------------------------------------------------------ what is on disk

BIG = {"pad": "x" * 400_000}  # provenance that makes a ~400 kB payload


def _big_entry(rows: int) -> Entry:
    e = make_entry(fingerprint(), 1.0, problem={"rows": rows, "cols": 32, "dtype": "float32"})
    return dataclasses.replace(e, provenance=BIG)


def test_a_large_entry_stays_in_the_database_file(isolated_cache):
    """No payload is ever kept in a file beside the database, so no row names a path the store would follow."""
    entry = _big_entry(8)
    with Store() as store:
        store.put(entry)
        assert store.get(entry.key) == entry
    assert sorted(p.name for p in isolated_cache.iterdir()) == [DB_NAME]
    with sqlite3.connect(isolated_cache / DB_NAME) as conn:
        assert [c[1] for c in conn.execute("PRAGMA table_info(entries)")] == ["digest", "stored_at", "payload"]


def test_an_old_diskcache_store_beside_it_is_never_opened(isolated_cache, tmp_path, caplog):
    """A `cache.db` of an older tunekit (diskcache) may hold pickles: it is never read, and said once."""
    import diskcache

    marker = tmp_path / "marker"
    with diskcache.Cache(str(isolated_cache)) as legacy:
        legacy.set("k", Pickled(marker))  # stored pickled (MODE_PICKLE): reading it would run the payload
        legacy.set(Pickled(marker), "v")  # a pickled key
    entry = make_entry(fingerprint(), 1.0)
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        for _ in range(2):
            with Store() as store:
                assert list(store.entries()) == [] and len(store) == 0
    said = [r.getMessage() for r in caplog.records if LEGACY_NAME in r.getMessage()]
    assert len(said) == 1 and "never read" in said[0] and "delete" not in said[0]
    with Store() as store:
        store.put(entry)
        assert store.get(entry.key) == entry
    assert not marker.exists()


class Pickled:
    """Unpickling this writes a marker file: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('unpickled')",))


# ------------------------------------------------------------------------------------------ files the store refuses


def _outside_db(tmp_path: Path, entry: Entry) -> Path:
    """A healthy store outside the cache dir: what a symlink or hard link would let a write reach."""
    with Store(tmp_path / "elsewhere") as other:
        other.put(entry)
    return tmp_path / "elsewhere" / DB_NAME


def _snapshot(path: Path) -> tuple:
    st = os.lstat(path)
    return (st.st_mode, st.st_size, st.st_mtime_ns, path.read_bytes() if path.is_file() else None)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "directory", "socket"])
def test_a_database_file_that_is_not_a_plain_file_is_refused(isolated_cache, tmp_path, kind):
    """A link at the database's name would let a write reach a file outside the store; a directory or socket is
    not a store. Opening, reading and writing each refuse in one line; nothing outside is touched."""
    entry = make_entry(fingerprint(), 1.0)
    target = _outside_db(tmp_path, entry)
    before = _snapshot(target)
    store = Store()  # a handle opened while the store was empty and healthy
    path = isolated_cache / DB_NAME
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, path)
    elif kind == "directory":
        path.mkdir()
    else:
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    with pytest.raises(CacheError, match=r"cannot open the cache store at .*(symlink|hard links|directory|socket)"):
        Store()
    assert store.get(entry.key) is None and list(store.entries()) == []
    with pytest.raises(CacheError, match="cannot write the cache store"):
        store.put(make_entry(fingerprint(), 0.5))
    assert _snapshot(target) == before


@pytest.mark.parametrize(
    "sidecar, kind",
    [("-journal", "symlink"), ("-journal", "directory"), ("-wal", "file"), ("-shm", "file"), ("-wal", "symlink")],
)
def test_journal_names_that_tunekit_never_writes_are_refused(isolated_cache, tmp_path, caplog, sidecar, kind):
    """SQLite opens (and writes) the journal, -wal and -shm files beside the database, following symlinks."""
    entry = make_entry(fingerprint(), 1.0)
    with Store() as store:
        store.put(entry)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    before = _snapshot(outside)
    path = Path(f"{isolated_cache / DB_NAME}{sidecar}")
    if kind == "symlink":
        path.symlink_to(outside)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"\0" * 32)
    with pytest.raises(CacheError, match="cannot open the cache store"):
        Store()
    with pytest.raises(CacheError, match="cannot write the cache store"):
        store.put(make_entry(fingerprint(), 0.5))
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        assert store.get(entry.key) is None
    assert any("unreadable" in r.getMessage() and sidecar in r.getMessage() for r in caplog.records)
    assert _snapshot(outside) == before
    path.unlink() if not path.is_dir() else path.rmdir()
    assert store.get(entry.key) == entry  # nothing was lost


FIFO_SCRIPT = """
import json, os, sqlite3, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tunekit.core import registry
from tunekit.runtime.dispatch import dispatcher
from tunekit.core.errors import CacheError
from tunekit.store.file_safety import TABLE_SQL
from tunekit.store.store import DB_NAME, Store
root, out = Path(sys.argv[1]), {}
for case in ("database", "journal", "after-open"):
    d = root / case
    store = Store(d)  # opened while empty and healthy
    if case == "journal":  # a journal matters once a database exists
        with sqlite3.connect(d / DB_NAME) as conn:
            conn.execute(TABLE_SQL)
    os.mkfifo(d / (DB_NAME + "-journal" if case == "journal" else DB_NAME))
    try:
        Store(d)
        out[case] = "opened"
    except CacheError as exc:
        out[case] = str(exc)
    out[case + " reads"] = [list(store.entries()), len(store)]
os.environ["TUNEKIT_CACHE_DIR"] = str(root / "database")
registry.KERNELS["toy"] = "toy_kernel"
d = dispatcher("toy")
d.config((8, 32, "float32"))
out["served_by"] = d.served_by[(8, 32, "float32")]
print(json.dumps(out))
"""


def test_a_fifo_where_the_database_or_its_journal_should_be_never_hangs(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: the store checks what a name is before opening it.
    Run in a child process with a time limit, so a hang fails the test instead of stalling the suite."""
    result = subprocess.run(
        [sys.executable, "-c", FIFO_SCRIPT, str(tmp_path), str(TESTS)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for case in ("database", "journal", "after-open"):
        assert "cannot open the cache store" in out[case] and "a FIFO, not a regular file" in out[case]
        assert out[f"{case} reads"] == [[], 0]
    assert out["served_by"] == "heuristic"  # dispatch fell back, said so, and went on
    assert "Traceback" not in result.stderr


def test_a_hot_journal_naming_a_super_journal_is_refused_and_its_target_kept(isolated_cache, tmp_path):
    """A journal left by a killed writer is rolled back by the next writer; if it ends in a super-journal record,
    SQLite opens the file it names and deletes it. tunekit never writes one, so it refuses the store."""
    entry = make_entry(fingerprint(), 1.0)
    with Store() as store:
        store.put(entry)
    journal = leave_hot_journal(isolated_cache)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    name_super_journal(journal, victim)
    with pytest.raises(CacheError, match="names a super-journal"):
        Store()
    with pytest.raises(CacheError, match="names a super-journal"):
        store.put(make_entry(fingerprint(), 0.5))
    assert store.get(entry.key) is None
    assert victim.read_text() == "precious\n"


def test_a_writer_killed_mid_write_is_rolled_back_by_the_next_reader(isolated_cache, caplog):
    """A read-only connection cannot roll back a hot journal; the store does it through a writable one, once."""
    entry = make_entry(fingerprint(), 1.0)
    with Store() as store:
        store.put(entry)
    journal = leave_hot_journal(isolated_cache)
    with caplog.at_level(logging.WARNING, logger="tunekit"), Store() as store:
        assert store.get(entry.key) == entry and len(store) == 1  # the killed writer's rows are gone
    assert not journal.exists() and caplog.records == []


def test_a_schema_that_tunekit_never_writes_is_refused(isolated_cache):
    """A trigger or view would make the store's own statements run SQL from the file."""
    entry = make_entry(fingerprint(), 1.0)
    with Store() as store:
        store.put(entry)
    with sqlite3.connect(isolated_cache / DB_NAME) as conn:
        conn.execute("CREATE TRIGGER t AFTER INSERT ON entries BEGIN DELETE FROM entries; END")
    with pytest.raises(CacheError, match="tables, views or triggers that tunekit never writes"):
        Store()
    with pytest.raises(CacheError, match="tables, views or triggers"):
        store.put(make_entry(fingerprint(), 0.5))


def test_a_wal_mode_database_is_refused(isolated_cache):
    with Store() as store:
        store.put(make_entry(fingerprint(), 1.0))
    conn = sqlite3.connect(isolated_cache / DB_NAME)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    with pytest.raises(CacheError, match="WAL mode"):
        Store()


# ------------------------------------------------------------------------------------------ read-only, full, locked


def serve_then_write(directory: Path, break_disk: Callable[[], None]) -> dict:
    """Store an entry, break the disk (read-only, full), then read it back and try a large write. Runs in this
    process or in a child with a private tmpfs (run_in_tmpfs)."""
    e = make_entry(fingerprint(), 1.5)
    with Store(directory) as s:
        s.put(e)
    break_disk()
    out: dict = {}
    with Store(directory) as s:
        out["served"] = s.get(e.key) == e and [x.key.digest for x in s.entries()] == [e.key.digest]
        try:
            s.put(_big_entry(16))
        except CacheError as exc:
            out["error"] = str(exc)
        out["kept"] = s.get(e.key) == e and len(s) == 1
    return out


def _check_served_and_refused(out: dict, cause: str) -> None:
    """The healthy store's entries are served and kept; the write is refused naming the cause, and the message
    never calls the store damaged nor tells anyone to delete it."""
    assert out["served"] is True and out["kept"] is True
    assert "cannot write the cache store" in out["error"] and cause in out["error"], out["error"]
    assert "still served" in out["error"]
    assert "delete" not in out["error"].lower() and "damaged" not in out["error"]


IN_TMPFS = f"""
import json
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_store import serve_then_write
print(json.dumps(serve_then_write(MNT / "cache", {{}})))
"""


@pytest.mark.skipif(os.geteuid() == 0 and not private_tmpfs_available(), reason="needs a read-only mount")
def test_a_read_only_store_serves_its_entries(tmp_path):
    """Reads never need write access (mode=ro, rollback journal: no -shm to create), so a read-only mount serves
    every entry; a write is refused with a message that does not call the healthy store damaged."""
    if os.geteuid() == 0:  # root ignores permissions: a real read-only mount
        result = run_in_tmpfs(tmp_path / "mnt", 1024, IN_TMPFS.format("remount_ro"))
        assert result.returncode == 0, result.stderr[-3000:]
        _check_served_and_refused(json.loads(result.stdout.strip().splitlines()[-1]), "read-only")
        return
    cache = tmp_path / "cache"

    def read_only() -> None:
        (cache / DB_NAME).chmod(0o444)
        cache.chmod(0o555)

    try:
        _check_served_and_refused(serve_then_write(cache, read_only), "read-only")
    finally:
        cache.chmod(0o755)


@pytest.mark.skipif(not private_tmpfs_available(), reason="needs a private tmpfs (unshare -m and mount)")
def test_a_full_disk_still_serves_and_a_write_says_enospc(tmp_path):
    result = run_in_tmpfs(tmp_path / "mnt", 512, IN_TMPFS.format("fill_disk"))
    assert result.returncode == 0, result.stderr[-3000:]
    _check_served_and_refused(json.loads(result.stdout.strip().splitlines()[-1]), "ENOSPC")


def test_a_full_database_says_enospc_without_blaming_the_store(tmp_path, monkeypatch):
    """The same on any machine: SQLite's max_page_count makes every growing write fail as a full disk does."""
    from tunekit.store import store as store_mod

    real = store_mod._connect

    def capped(path: Path, read_only: bool) -> sqlite3.Connection:
        conn = real(path, read_only)
        conn.execute("PRAGMA max_page_count = 1")  # never below the current size: no page can be added
        return conn

    def fill() -> None:
        monkeypatch.setattr(store_mod, "_connect", capped)

    _check_served_and_refused(serve_then_write(tmp_path / "cache", fill), "ENOSPC")


def test_a_lock_held_too_long_is_a_bounded_wait_and_reads_go_on(isolated_cache, monkeypatch):
    from tunekit.store import store as store_mod

    e = make_entry(fingerprint(), 1.5)
    with Store() as s:
        s.put(e)
    monkeypatch.setattr(store_mod, "TIMEOUT_S", 0.3)
    holder = sqlite3.connect(isolated_cache / DB_NAME, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer, mid-transaction
    try:
        with Store() as s:
            assert s.get(e.key) == e  # readers are not blocked by a writer's pending transaction
            t0 = time.monotonic()
            with pytest.raises(CacheError, match=r"held its lock for more than 0 s.*try again"):
                s.put(make_entry(fingerprint(), 1.0))
            assert time.monotonic() - t0 < 10
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# ------------------------------------------------------------------------------------------ size


def test_the_store_is_unbounded_unless_a_cap_is_set(isolated_cache, monkeypatch, caplog):
    monkeypatch.delenv("TUNEKIT_CACHE_MAX_MB", raising=False)
    entries = [_big_entry(2**k) for k in range(6)]  # ~2.4 MB
    with caplog.at_level(logging.WARNING, logger="tunekit"), Store() as store:
        for e in entries:
            store.put(e)
        assert {x.key.digest for x in store.entries()} == {e.key.digest for e in entries}
    assert caplog.records == []


def test_a_cap_evicts_the_least_recently_stored_and_says_how_many(isolated_cache, monkeypatch, caplog):
    monkeypatch.setenv("TUNEKIT_CACHE_MAX_MB", "1")
    e0, e1, e2, e3 = (_big_entry(2**k) for k in range(4))  # ~400 kB each: two fit under 1 MB, three do not

    def put(store: Store, entry: Entry) -> tuple[set[str], list[str]]:
        caplog.clear()
        store.put(entry)
        return {x.key.digest for x in store.entries()}, [r.getMessage() for r in caplog.records]

    with caplog.at_level(logging.WARNING, logger="tunekit"), Store() as store:
        assert put(store, e0) == ({e0.key.digest}, [])
        assert put(store, e1) == ({e0.key.digest, e1.key.digest}, [])  # under the cap: nothing evicted or said
        kept, said = put(store, e2)
        assert kept == {e1.key.digest, e2.key.digest}  # the least recently stored went
        assert len(said) == 1 and "past TUNEKIT_CACHE_MAX_MB=1: evicted 1 entry" in said[0]
        put(store, e1)  # stored again: now the most recent
        kept, said = put(store, e3)
        assert kept == {e1.key.digest, e3.key.digest} and "evicted 1 entry" in said[0]


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "lots"])
def test_a_bad_cap_is_refused_naming_the_variable(isolated_cache, monkeypatch, value):
    monkeypatch.setenv("TUNEKIT_CACHE_MAX_MB", value)
    message = f"TUNEKIT_CACHE_MAX_MB must be a positive integer.*{value}"
    with Store() as store, pytest.raises(TunekitError, match=message):
        store.put(make_entry(fingerprint(), 1.0))
    assert len(Store()) == 0


def test_a_journal_unlinked_while_it_is_checked_is_another_writers_not_a_crafted_file(tmp_path, monkeypatch):
    """Eight writers at once (test_concurrency) once saw a journal whose lstat said 0 links: a concurrent writer
    had just unlinked it. That is a transaction ending, not a hard link planted beside the store."""
    import os as real_os
    import stat as stat_module

    from tunekit.store import file_safety

    store = Store(tmp_path / "store")
    try:
        store.put(make_entry(H200, 1.0))
    finally:
        store.close()
    db = tmp_path / "store" / file_safety.DB_NAME
    real_lstat = real_os.lstat

    def lstat(name, *args, **kwargs):
        if str(name).endswith("-journal"):
            st = real_lstat(db)
            fields = list(st)
            fields[stat_module.ST_NLINK] = 0
            return real_os.stat_result(fields)
        return real_lstat(name, *args, **kwargs)

    monkeypatch.setattr(file_safety.os, "lstat", lstat)
    assert file_safety.check_files(db)  # the database is checked, the vanished journal skipped
