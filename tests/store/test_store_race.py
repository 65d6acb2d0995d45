"""The store opens what it checked: swapping `store.sqlite3` for a symlink (or another file) between the check and
SQLite's open never creates or writes a file outside the cache (a swap once created a new SQLite file at the
link's target, or committed into an existing tunekit-format database there)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import make_entry

from tunekit.core.device import fingerprint
from tunekit.core.errors import CacheError
from tunekit.store import store as store_mod
from tunekit.store.store import DB_NAME, Store


def _swap_before_sqlite_opens(monkeypatch: pytest.MonkeyPatch, db: Path, target: Path) -> None:
    """The race, made deterministic: once the store has checked its file, and before SQLite opens it, the file
    becomes a symlink to `target`."""
    connect = store_mod._connect

    def swapped(path: Path, read_only: bool):
        if read_only:
            return connect(path, read_only)
        if db.exists() or db.is_symlink():
            db.unlink()
        db.symlink_to(target)
        return connect(path, read_only)

    monkeypatch.setattr(store_mod, "_connect", swapped)


def test_a_swap_to_a_new_path_creates_nothing_outside(isolated_cache, tmp_path, monkeypatch, toy):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "created.sqlite3"
    store = Store()
    store.put(make_entry(fingerprint(), 1.0))
    _swap_before_sqlite_opens(monkeypatch, isolated_cache / DB_NAME, target)
    with pytest.raises(CacheError):
        store.put(make_entry(fingerprint(), 0.5, block=8))
    assert not target.exists() and os.listdir(outside) == []


def test_a_swap_to_an_existing_store_writes_nothing_there(isolated_cache, tmp_path, monkeypatch, toy):
    outside = tmp_path / "outside"
    Store(outside).put(make_entry(fingerprint(), 3.0))
    before = (outside / DB_NAME).read_bytes()
    store = Store()
    store.put(make_entry(fingerprint(), 1.0))
    _swap_before_sqlite_opens(monkeypatch, isolated_cache / DB_NAME, outside / DB_NAME)
    with pytest.raises(CacheError):
        store.put(make_entry(fingerprint(), 0.5, block=8))
    assert (outside / DB_NAME).read_bytes() == before
    assert sorted(os.listdir(outside)) == [DB_NAME]


def test_a_swap_on_first_write_creates_nothing_outside(isolated_cache, tmp_path, monkeypatch, toy):
    """No store yet: the write that creates it never lets SQLite create the file (the store creates it itself,
    without following a link)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(isolated_cache, ignore_errors=True)
    store = Store()
    _swap_before_sqlite_opens(monkeypatch, isolated_cache / DB_NAME, outside / "new.sqlite3")
    with pytest.raises(CacheError):
        store.put(make_entry(fingerprint(), 0.5))
    assert os.listdir(outside) == []


def test_a_real_race_writes_nothing_outside(isolated_cache, tmp_path, toy):
    """The adversary's loop: another thread swaps store.sqlite3 for a symlink (to a new path, and to an existing
    tunekit database outside) and back, as fast as it can, while this one writes. Every write lands in the store
    or is refused; nothing outside is created or changed."""
    import threading
    import time

    outside = tmp_path / "outside"
    Store(outside).put(make_entry(fingerprint(), 3.0))
    existing = (outside / DB_NAME).read_bytes()
    db, kept = isolated_cache / DB_NAME, isolated_cache / "kept"
    store = Store()
    store.put(make_entry(fingerprint(), 1.0))
    stop = threading.Event()

    def swap() -> None:
        targets = [outside / "new.sqlite3", outside / DB_NAME]
        i = 0
        while not stop.is_set():
            try:
                os.rename(db, kept)
                db.symlink_to(targets[i % 2])
                time.sleep(0.0005)
                db.unlink()
                os.rename(kept, db)
            except OSError:
                pass
            i += 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    written = refused = 0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            store.put(make_entry(fingerprint(), 0.5 + written * 1e-3, block=8))
            written += 1
        except CacheError:
            refused += 1
    stop.set()
    swapper.join()
    if db.is_symlink():
        db.unlink()
    if kept.exists():
        os.rename(kept, db)
    assert written + refused > 20
    assert sorted(os.listdir(outside)) == [DB_NAME] and (outside / DB_NAME).read_bytes() == existing
