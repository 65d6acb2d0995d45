"""Crafted cache directories: whatever a shared, copied or untarred TUNEKIT_CACHE_DIR holds, no command and no op
runs code from it, touches a file outside it, hangs on it or prints a traceback, and valid entries are still served.

Each example builds one directory that mixes:
- an old diskcache `cache.db` (or a FIFO, directory or symlink in its place) with every row mode: raw text and
  bytes, values kept in files, pickled values and keys whose loading writes a marker file, file pointers inside
  and outside the directory and to a FIFO, and crafted Settings rows;
- tunekit's own `store.sqlite3` (or something else in its place: absent, empty, a FIFO, a directory, a symlink or
  hard link to a store outside, garbage, a WAL database, a schema with a trigger, a view or another table), with
  crafted rows beside two valid entries: payloads that are blobs, pickles, numbers, huge or deeply nested JSON,
  entries under another digest, keys that are not text;
- files SQLite would open beside it: journals that are symlinks, FIFOs, directories or hard links, -wal and
  -shm files, a journal left hot by a killed writer, one naming a super-journal outside the store.
Then `tunekit show`, `tunekit export`, `tunekit.ops.layer_norm` and `tunekit tune` run against it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import pickle
import shutil
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import diskcache
import pytest
import torch
from crafting import leave_hot_journal, name_super_journal, plant
from helpers import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store import Pickled

import tunekit.ops
from tunekit.core import registry
from tunekit.core.device import fingerprint
from tunekit.runtime.dispatch import dispatcher, reset_all
from tunekit.store import store as store_mod
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.store.store import DB_NAME, LEGACY_NAME, Store

BOUND_S = 30  # no example may take longer (a typical one takes under a second)
MAX_PAYLOAD = 2**18  # the store's payload cap, lowered so that a "huge" payload stays cheap to build
LN_KEY = (4, 64, "float32", True, True)
TOY_KEY = (8, 32, "float32")

LEGACY_ROWS = [
    "raw-text",
    "raw-bytes",
    "file-text",
    "file-bytes",
    "pickled-value",
    "pickled-key",
    "pointer-inside",
    "pointer-outside-absolute",
    "pointer-outside-relative",
    "pointer-fifo",
]
LEGACY_SETTINGS = [
    ("eviction_policy", "bogus"),
    ("disk_min_file_size", "NaN"),
    ("disk_pickle_protocol", 99),
    ("sqlite_journal_mode", "off; DROP TABLE Cache"),
    ("sqlite_mmap_size", "x'00'"),
    ("size_limit", -1),
    ("cull_limit", "all"),
    ("statistics", "yes"),
]
LEGACY_FILES = ["db", "db", "db", "fifo", "directory", "symlink-outside"]
STORE_FILES = [
    "ours",
    "ours",
    "ours",
    "ours",
    "absent",
    "empty",
    "fifo",
    "directory",
    "symlink-outside",
    "hardlink-outside",
    "garbage",
    "wal",
    "trigger",
    "view",
    "extra-table",
]
STORE_ROWS = [
    "blob-json",
    "blob-pickle",
    "integer",
    "float",
    "garbage-text",
    "huge-json",
    "deep-json",
    "another-digest",
    "blob-digest",
    "integer-digest",
    "newer-schema",
    "outside-space",
    "path-text",
]
SIDECARS = [
    "none",
    "none",
    "none",
    "journal-symlink-outside",
    "journal-fifo",
    "journal-directory",
    "journal-hardlink-outside",
    "wal-file",
    "shm-fifo",
    "hot-journal",
    "hot-journal-super-outside",
    "stale-zero-journal",
]
REFUSED_FILES = {"fifo", "directory", "symlink-outside", "hardlink-outside", "garbage", "wal", "trigger", "view"}
REFUSED_FILES |= {"extra-table"}
REFUSED_SIDECARS = {s for s in SIDECARS if s not in ("none", "hot-journal", "stale-zero-journal")}

TRIED: Counter[str] = Counter()  # what the examples covered, printed at the end


@pytest.fixture(autouse=True)
def fixtures(toy, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(store_mod, "MAX_PAYLOAD_CHARS", MAX_PAYLOAD)
    yield
    store_mod._warned.clear()


def _layernorm_entry() -> Entry:
    """A valid layernorm entry for LN_KEY whose config is not the heuristic's: served only from the store. Its time
    is the physical floor (tunekit.store.floors: 0.1 ms for Triton code in the interpreter; the toy's, plain torch,
    1 us): no measurement beats it, and a faster stored time would be ignored."""
    spec, device = registry.get_spec("layernorm"), fingerprint()
    problem = spec.problem_dict(LN_KEY)
    heuristic = dict(spec.heuristic(problem, device))
    config = next(c for c in spec.space.valid_configs(problem, device) if dict(c) != heuristic)
    key = CacheKey.make("layernorm", spec.source_hash, device.key, problem)
    return Entry(key, dict(config), 0.1, device.to_json(), {"strategy": "planted"}, (TrialRecord(config, "ok", 0.1),))


def _toy_entry(rows: int = 8, block: int = 8) -> Entry:
    spec, device = registry.get_spec("toy"), fingerprint()
    problem = {"rows": rows, "cols": 32, "dtype": "float32"}
    config = {"BLOCK": block, "variant": "a", "num_warps": 4}
    key = CacheKey.make("toy", spec.source_hash, device.key, problem)
    return Entry(key, config, 1e-3, device.to_json(), {"strategy": "planted"}, (TrialRecord(config, "ok", 1e-3),))


# ------------------------------------------------------------------------------------------ building a store


def _sentinel(root: Path) -> Path:
    """Files outside the store that a followed pointer, link or super-journal would reach."""
    outside = root / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    (outside / "dir").mkdir()
    (outside / "dir" / "inner.txt").write_text("inner\n")
    os.mkfifo(outside / "victim.fifo")
    with Store(outside / "store") as healthy:  # a store outside: the target of a link at the database's name
        healthy.put(_toy_entry(block=16))
    return outside


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: its type, size, mtime and (regular files) content. Never opens a FIFO."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            content = p.read_bytes() if p.is_file() and not p.is_symlink() else None
            found[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    return found


def _legacy(cache: Path, outside: Path, marker: Path, kind: str, rows: list[str], settings_rows: list) -> None:
    path = cache / LEGACY_NAME
    if kind == "fifo":
        os.mkfifo(path)
        return
    if kind == "directory":
        path.mkdir()
        return
    if kind == "symlink-outside":
        path.symlink_to(outside / "victim.txt")
        return
    pointers = {
        "pointer-inside": "00/00/inside.val",
        "pointer-outside-absolute": str(outside / "victim.txt"),
        "pointer-outside-relative": "../outside/victim.txt",
        "pointer-fifo": str(outside / "victim.fifo"),
    }
    with diskcache.Cache(str(cache)) as legacy:
        for i, row in enumerate(rows):
            key = f"{row}-{i}"
            if row == "raw-text":
                legacy.set(key, json.dumps(_toy_entry().to_json()))
            elif row == "raw-bytes":
                legacy.set(key, b"\x00\x80bytes")
            elif row == "file-text":
                legacy.set(key, "x" * 40_000)  # kept in a file beside the database (MODE_TEXT)
            elif row in ("file-bytes", *pointers):
                legacy.set(key, b"y" * 40_000)  # MODE_BINARY, in a file
            elif row == "pickled-value":
                legacy.set(key, Pickled(marker))  # MODE_PICKLE
            elif row == "pickled-key":
                legacy.set(Pickled(marker), "value")
    (cache / "00" / "00").mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        (cache / "00" / "00" / "inside.val").write_bytes(b"z" * 10)
        for i, row in enumerate(rows):
            if row in pointers:
                conn.execute("UPDATE Cache SET filename = ? WHERE key = ?", (pointers[row], f"{row}-{i}"))
                conn.execute("UPDATE Cache SET mode = 4 WHERE key = ?", (f"{row}-{i}",))  # and say it is a pickle
        conn.executemany("INSERT OR REPLACE INTO Settings (key, value) VALUES (?, ?)", settings_rows)


def _store_rows(cache: Path, rows: list[str], marker: Path) -> None:
    toy = _toy_entry()
    for i, row in enumerate(rows):
        digest: object = f"{i:032x}"
        other = _toy_entry(rows=2 ** (i + 10))  # a key of its own: it never replaces the valid entries
        if row == "blob-json":
            digest, payload = other.key.digest, json.dumps(other.to_json()).encode()
        elif row == "blob-pickle":
            payload = pickle.dumps(Pickled(marker))
        elif row == "integer":
            payload = 12345
        elif row == "float":
            payload = 1.5
        elif row == "garbage-text":
            payload = "{not json"
        elif row == "huge-json":
            payload = json.dumps({"pad": "x" * (MAX_PAYLOAD + 10)})
        elif row == "deep-json":
            payload = "[" * 100_000 + "]" * 100_000
        elif row == "another-digest":
            payload = json.dumps(toy.to_json())  # a valid entry under a key that is not its own
        elif row == "blob-digest":
            digest, payload = toy.key.digest.encode() + b"x", json.dumps(toy.to_json())
        elif row == "integer-digest":
            digest, payload = 7, json.dumps(toy.to_json())
        elif row == "newer-schema":
            data = other.to_json()
            data["key"]["schema"] = 99
            digest, payload = other.key.digest, json.dumps(data)
        elif row == "outside-space":
            e = _toy_entry(rows=2 ** (i + 10), block=3)
            digest, payload = e.key.digest, json.dumps(e.to_json())
        else:  # path-text
            payload = "../outside/victim.txt"
        plant(digest, payload, cache)


def _store_file(cache: Path, outside: Path, kind: str) -> None:
    """Replace (or rework) the database file. 'ours' and 'absent' leave it as built."""
    path = cache / DB_NAME
    if kind in ("ours", "absent"):
        return
    if kind in ("wal", "trigger", "view", "extra-table"):
        conn = sqlite3.connect(path, isolation_level=None)
        if kind == "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        elif kind == "trigger":
            conn.execute("CREATE TRIGGER t AFTER INSERT ON entries BEGIN DELETE FROM entries; END")
        elif kind == "view":
            conn.execute("ALTER TABLE entries RENAME TO real_entries")
            conn.execute("CREATE VIEW entries AS SELECT * FROM real_entries")
        else:
            conn.execute("CREATE TABLE Settings (key TEXT, value)")
        conn.close()
        for suffix in ("-wal", "-shm"):  # a WAL database closed cleanly leaves only its header saying WAL
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    path.unlink(missing_ok=True)
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-outside":
        path.symlink_to(outside / "store" / DB_NAME)
    elif kind == "hardlink-outside":
        os.link(outside / "store" / DB_NAME, path)
    elif kind == "garbage":
        path.write_bytes(os.urandom(8192))


def _sidecar(cache: Path, outside: Path, kind: str) -> None:
    path = cache / DB_NAME
    journal = Path(f"{path}-journal")
    if kind == "journal-symlink-outside":
        journal.symlink_to(outside / "victim.txt")
    elif kind == "journal-fifo":
        os.mkfifo(journal)
    elif kind == "journal-directory":
        journal.mkdir()
    elif kind == "journal-hardlink-outside":
        os.link(outside / "victim.txt", journal)
    elif kind == "wal-file":
        Path(f"{path}-wal").write_bytes(b"\0" * 64)
    elif kind == "shm-fifo":
        os.mkfifo(f"{path}-shm")
    elif kind == "hot-journal":
        leave_hot_journal(cache)
    elif kind == "hot-journal-super-outside":
        name_super_journal(leave_hot_journal(cache), outside / "victim.txt")
    elif kind == "stale-zero-journal":
        journal.write_bytes(b"\0" * 512)


@st.composite
def crafted_stores(draw: st.DrawFn) -> dict:
    healthy_files = [f for f in STORE_FILES if f not in REFUSED_FILES]
    healthy_sidecars = [s for s in SIDECARS if s not in REFUSED_SIDECARS]
    if draw(st.booleans()):  # half the stores hold a database tunekit accepts, among crafted rows
        store_file, sidecar = draw(st.sampled_from(healthy_files)), draw(st.sampled_from(healthy_sidecars))
    else:
        store_file, sidecar = draw(st.sampled_from(STORE_FILES)), draw(st.sampled_from(SIDECARS))
    if sidecar.startswith("hot-journal") and store_file != "ours":
        sidecar = "none"  # a hot journal needs a database a writer was killed in
    return {
        "legacy_file": draw(st.sampled_from(LEGACY_FILES)),
        "legacy_rows": draw(st.lists(st.sampled_from(LEGACY_ROWS), max_size=6)),
        "legacy_settings": draw(st.lists(st.sampled_from(LEGACY_SETTINGS), max_size=3, unique=True)),
        "store_file": store_file,
        "store_rows": draw(st.lists(st.sampled_from(STORE_ROWS), max_size=5)),
        "stored_at_text": draw(st.booleans()),
        "sidecar": sidecar,
    }


def build(root: Path, recipe: dict, marker: Path) -> tuple[Path, Path, dict[str, tuple]]:
    """The crafted cache directory, the sentinel directory outside it and the sentinel's snapshot (taken before
    anything is crafted: building uses the store too)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    outside = _sentinel(root)
    before = _snapshot(outside)
    cache = root / "cache"
    cache.mkdir()
    _legacy(cache, outside, marker, recipe["legacy_file"], recipe["legacy_rows"], recipe["legacy_settings"])
    if recipe["store_file"] != "absent":
        stored_at = "yesterday" if recipe["stored_at_text"] else 0.0
        for e in (_toy_entry(), _layernorm_entry()):
            plant(e.key.digest, json.dumps(e.to_json()), cache, stored_at=stored_at)
        _store_rows(cache, recipe["store_rows"], marker)
    _store_file(cache, outside, recipe["store_file"])
    _sidecar(cache, outside, recipe["sidecar"])
    return cache, outside, before


# ------------------------------------------------------------------------------------------ running against it


def _cli(*args: str) -> tuple[int, str]:
    """Exit code and output; never an exception or a traceback, at most one error line."""
    result = cli(*args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == (result.exit_code == 1), result.output
    return result.exit_code, result.output


def _layer_norm_served_by() -> str:
    reset_all()
    x = torch.randn(4, 64)
    w, b = torch.randn(64), torch.randn(64)
    y = tunekit.ops.layer_norm(x, (64,), w, b)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (64,), w, b), rtol=1e-4, atol=1e-4)
    return dispatcher("layernorm").served_by[LN_KEY]


def _toy_served() -> tuple[dict, str]:
    reset_all()
    d = dispatcher("toy")
    return dict(d.config(TOY_KEY)), d.served_by[TOY_KEY]


@contextlib.contextmanager
def bounded(root: Path, seconds: float) -> Iterator[None]:
    """Fail if the body opens a FIFO under `root` for reading, or takes longer than `seconds`.

    A watcher opens every FIFO under root for writing, without blocking, ten times a second: that succeeds only
    while someone holds the FIFO open for reading (nothing in a healthy run ever does), and it releases a reader
    blocked in open(), so the test fails with a message instead of hanging. Anything else still stuck after
    3x `seconds` is ended by faulthandler, which dumps every thread's stack and exits the run."""
    done, opened = threading.Event(), []

    def watch() -> None:
        while not done.wait(0.1):
            for fifo in [p for p in root.rglob("*") if p.is_fifo()]:
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                    opened.append(str(fifo))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    faulthandler.dump_traceback_later(3 * seconds, exit=True)
    t0 = time.monotonic()
    try:
        yield
    except BaseException as exc:
        if opened:
            raise AssertionError(f"a FIFO was opened for reading: {sorted(set(opened))}") from exc
        raise
    finally:
        done.set()
        faulthandler.cancel_dump_traceback_later()
        watcher.join()
    assert not opened, f"a FIFO was opened for reading: {sorted(set(opened))}"
    assert time.monotonic() - t0 < seconds


def check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: dict) -> None:
    """Build the store of `recipe`, run show, export, the op and tune against it, and check after each."""
    with bounded(tmp_path, BOUND_S):
        _check(tmp_path, monkeypatch, recipe)


def _check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: dict) -> None:
    marker = tmp_path / "marker" / "unpickled"
    marker.parent.mkdir(exist_ok=True)
    cache, outside, before = build(tmp_path / "crafted", recipe, marker)
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(cache))
    store_mod._warned.clear()
    refused = recipe["store_file"] in REFUSED_FILES or recipe["sidecar"] in REFUSED_SIDECARS
    valid = recipe["store_file"] == "ours" and not refused
    TRIED["stores"] += 1
    TRIED["refused" if refused else "served" if valid else "empty"] += 1
    TRIED[f"file:{recipe['store_file']}"] += 1
    TRIED[f"sidecar:{recipe['sidecar']}"] += 1
    TRIED[f"legacy-file:{recipe['legacy_file']}"] += 1
    TRIED.update(f"legacy-row:{r}" for r in recipe["legacy_rows"])
    TRIED.update(f"row:{r}" for r in recipe["store_rows"])
    expected = {_toy_entry().key.digest, _layernorm_entry().key.digest} if valid else set()
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)

    def unharmed() -> None:
        assert not marker.exists(), "something unpickled a crafted payload"
        assert _snapshot(outside) == before, "a file outside the store was touched"

    code, output = _cli("show")
    assert code == (1 if refused else 0), output
    assert refused or f"{len(expected)} entries" in output, output
    assert not refused or "cannot open the cache store" in output
    unharmed()

    code, output = _cli("export", "--out", str(out))
    assert code == (1 if refused else 0), output
    if not refused:
        exported = {CacheKey.from_json(e["key"]).digest for e in json.loads(out.read_text())["entries"]}
        assert exported == expected
    unharmed()

    layer = _layer_norm_served_by()
    assert layer == "cache" if valid else layer != "cache"
    unharmed()

    code, output = _cli("tune", "--kernel", "toy", "--shape", "8x32", "--dtype", "float32", "--trials", "2")
    assert code == (1 if refused else 0), output
    unharmed()

    config, layer = _toy_served()  # after a write into the store, the valid entries are still served
    if valid:
        assert (config, layer) == (_toy_entry().config, "cache")
        assert _layer_norm_served_by() == "cache"
    elif refused:
        assert layer != "cache"
    unharmed()


EVERYTHING = {
    "legacy_file": "db",
    "legacy_rows": LEGACY_ROWS,
    "legacy_settings": LEGACY_SETTINGS,
    "store_file": "ours",
    "store_rows": STORE_ROWS,
    "stored_at_text": False,
    "sidecar": "none",
}
SWEEP = (
    [{**EVERYTHING, "store_file": f} for f in dict.fromkeys(STORE_FILES)]
    + [{**EVERYTHING, "sidecar": s} for s in dict.fromkeys(SIDECARS) if s != "none"]
    + [{**EVERYTHING, "legacy_file": f, "stored_at_text": True} for f in dict.fromkeys(LEGACY_FILES) if f != "db"]
    + [{**EVERYTHING, "legacy_settings": []}]  # crafted Settings make diskcache itself refuse to open: none here
)


@pytest.mark.parametrize(
    "recipe",
    SWEEP,
    ids=[f"{r['store_file']}-{r['sidecar']}-legacy_{r['legacy_file']}{len(r['legacy_settings'])}" for r in SWEEP],
)
def test_every_kind_of_crafted_file_once(tmp_path, monkeypatch, recipe):
    """Each kind of database file, journal file and old cache.db once, with every kind of crafted row."""
    check(tmp_path, monkeypatch, recipe)


@settings(
    max_examples=int(os.environ.get("CRAFTED_STORES", "25")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(recipe=crafted_stores())
def test_crafted_stores_run_no_code_touch_nothing_outside_and_serve_what_is_valid(tmp_path, monkeypatch, recipe):
    """Random mixes of all of the above (CRAFTED_STORES sets how many; 25 by default: each kind also runs once in
    test_every_kind_of_crafted_file_once, and the mixes differ from run to run)."""
    check(tmp_path, monkeypatch, recipe)


def test_zz_report_what_the_crafted_stores_covered():
    """Prints what the examples above tried (pytest -s shows it); fails if the fuzz ran without them."""
    if not TRIED:
        pytest.skip("the crafted-store fuzz did not run in this session")
    print("\ncrafted stores:", dict(sorted(TRIED.items())))
    assert TRIED["stores"] >= 1
