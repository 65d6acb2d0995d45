from __future__ import annotations

import errno
import json
import os
import stat

import pytest
from fingerprints import H200
from helpers import toy_entry

from tunekit.core.device import fingerprint
from tunekit.core.errors import DatabaseError
from tunekit.runtime.dispatch import resolve
from tunekit.store import atomic, bounded_file, database, document_reader
from tunekit.store.database import (
    ImportResult,
    document,
    export_entries,
    import_document,
    read_document,
    write_document,
)
from tunekit.store.store import Store


def test_export_import_round_trip(toy, tmp_path):
    entries = [toy_entry(toy, fingerprint(), 1.0, rows=8), toy_entry(toy, H200, 0.5, rows=16)]
    with Store(tmp_path / "a") as store:
        for e in entries:
            store.put(e)
        path = tmp_path / "db.json"
        assert write_document(path, export_entries(store)) == 2
    with Store(tmp_path / "b") as other:
        assert import_document(other, path) == ImportResult(read=2, added=2, improved=0, kept=0)
        assert {e.key: e.config for e in other.entries()} == {e.key: e.config for e in entries}


def test_export_filters_by_kernel_and_device(toy, tmp_path):
    with Store() as store:
        store.put(toy_entry(toy, fingerprint(), 1.0))
        store.put(toy_entry(toy, H200, 1.0))
        assert len(export_entries(store, kernel="toy")) == 2
        assert [e.key.device_key for e in export_entries(store, device_key=H200.key)] == [H200.key]


def test_import_merge_keeps_the_faster_entry(toy, tmp_path):
    slow, fast = toy_entry(toy, fingerprint(), 3.0, block=8), toy_entry(toy, fingerprint(), 1.0, block=32)
    path = tmp_path / "db.json"
    with Store() as store:
        store.put(fast)
        write_document(path, [slow])
        assert import_document(store, path) == ImportResult(read=1, added=0, improved=0, kept=1)
        assert store.get(fast.key).config["BLOCK"] == 32
        write_document(path, [toy_entry(toy, fingerprint(), 0.5, block=4)])
        assert import_document(store, path) == ImportResult(read=1, added=0, improved=1, kept=0)
        kept = store.get(fast.key)
        assert kept.config["BLOCK"] == 4 and kept.provenance["imported_from"] == "db.json"


@pytest.mark.parametrize("local_timer", ["cuda-events-median-l2-flushed", None])
def test_import_keeps_the_local_best_unless_the_same_timer_measured_faster(toy, tmp_path, local_timer):
    """Times of different timers (or of an unnamed one) are not comparable: the local best stays, trials too."""
    local = toy_entry(toy, fingerprint(), 2.0, block=8, timer=local_timer)
    path = tmp_path / "db.json"
    problem = dict(local.key.problem)
    with Store() as store:
        store.put(local)
        write_document(path, [toy_entry(toy, fingerprint(), 0.01, block=4, timer="interpreter-wall-clock")])
        assert import_document(store, path) == ImportResult(read=1, added=0, improved=0, kept=1)
        assert store.get(local.key) == local
        assert resolve(toy, problem, fingerprint(), store).config == local.config
        if local_timer is not None:  # the same timer, faster: replaces the local best
            write_document(path, [toy_entry(toy, fingerprint(), 0.01, block=4, timer=local_timer)])
            assert import_document(store, path).improved == 1
            assert resolve(toy, problem, fingerprint(), store).config["BLOCK"] == 4


def _write(tmp_path, payload) -> object:
    path = tmp_path / "bad.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema=2), "schema must be 1"),
        (lambda d: d.update(format="other"), "not a tunekit-db document"),
        (lambda d: d["entries"][1]["key"].update(kernel="nope"), "unknown kernel 'nope'"),
        (lambda d: d["entries"][1]["best"]["config"].update(BLOCK=3), "must be one of"),
        (lambda d: d["entries"][1]["best"]["config"].update(extra=1), "parameters must be exactly"),
        (lambda d: d["entries"][1]["best"].update(time_ms=-1), "time_ms must be a number"),
        (lambda d: d["entries"][1]["best"].update(time_ms="fast"), "time_ms must be a number"),
        (lambda d: d["entries"][1]["key"]["problem"].update(rows=2**60), "must be a string, bool or int"),
        (lambda d: d["entries"][1]["trials"][0].update(status="great"), "status must be one of"),
        (lambda d: d.update(entries={}), "'entries' must be a list"),
        # rules, not only membership: the toy space's rule is BLOCK <= cols (cols = 32 here)
        (lambda d: d["entries"][1]["best"]["config"].update(BLOCK=64), r"breaks the toy space's rule 'block_fits_row'"),
        (lambda d: d["entries"][1]["trials"][0]["config"].update(BLOCK=64), r"trials\[0\]: config .* 'block_fits_row'"),
        # physical floors: 1 us, or the problem's bytes at 20 TB/s
        (lambda d: d["entries"][1]["best"].update(time_ms=5e-324), "at least 0.001, the physical floor"),
        (lambda d: d["entries"][1]["best"].update(time_ms=0.0009), "at least 0.001, the physical floor"),
        (lambda d: d["entries"][1]["trials"][0].update(time_ms=1e-6), r"trials\[0\]: time_ms must be at least 0.001"),
        # the device object must be the device the key names, with every fingerprint field typed
        (lambda d: d["entries"][1]["device"].update(smem_per_block=2**30), "not the device key.device_key names"),
        (lambda d: d["entries"][1]["device"].update(sm_count="132"), "device.sm_count must be an int"),
        (lambda d: d["entries"][1]["device"].pop("vendor"), "device.vendor must be a string"),
        # one cache key twice
        (lambda d: d["entries"].append(d["entries"][0]), "entry 2: the same key as entry 0"),
    ],
)
def test_malformed_import_is_refused_and_store_unchanged(toy, tmp_path, mutate, message):
    good = toy_entry(toy, fingerprint(), 1.0, rows=8)
    doc = document([toy_entry(toy, fingerprint(), 0.1, rows=16), good])
    mutate(doc)  # entry-level faults go into the second entry: the first, valid one must not be written either
    with Store() as store:
        store.put(good)
        before = [e.to_json() for e in store.entries()]
        with pytest.raises(DatabaseError, match=message):
            import_document(store, _write(tmp_path, doc))
        assert [e.to_json() for e in store.entries()] == before


@pytest.mark.parametrize("payload", ["", "{", "[1, 2]", "null", '{"format": "tunekit-db"}'])
def test_not_a_database(tmp_path, payload):
    with pytest.raises(DatabaseError):
        read_document(_write(tmp_path, payload))


def test_missing_file(tmp_path):
    with pytest.raises(DatabaseError, match="cannot read"):
        read_document(tmp_path / "absent.json")


def test_a_failed_or_wrong_trial_may_break_the_rules(toy, tmp_path):
    """Only configs that ran ("ok") must pass the rules: a failed one is recorded data, never served."""
    entry = toy_entry(toy, fingerprint(), 1.0)
    doc = document([entry])
    doc["entries"][0]["trials"].append(
        {"config": {"BLOCK": 64, "variant": "b", "num_warps": 1}, "status": "failed", "time_ms": None, "error": "x"}
    )
    with Store() as store:
        assert import_document(store, _write(tmp_path, doc)).added == 1


def test_the_copy_floor_refuses_a_time_faster_than_any_memory(toy, tmp_path):
    """8 * 2^20 * 2^20 bytes (the toy's bytes_moved) take 440 ms at 20 TB/s: 1 ms is no measurement of them."""
    huge = toy_entry(toy, fingerprint(), 1.0, rows=2**20, cols=2**20)
    assert database.time_floor_ms(toy, dict(huge.key.problem)) == pytest.approx(8 * 2**40 / 20e12 * 1e3)
    with Store() as store, pytest.raises(DatabaseError, match="physical floor"):
        import_document(store, _write(tmp_path, document([huge])))
    ok = toy_entry(toy, fingerprint(), 500.0, rows=2**20, cols=2**20)
    with Store() as store:
        assert import_document(store, _write(tmp_path, document([ok]))).added == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"format": "tunekit-db", "format": "tunekit-db", "schema": 1, "entries": []}', "duplicate key 'format'"),
        ('{"format": "tunekit-db", "schema": 1, "entries": [], "entries": []}', "duplicate key 'entries'"),
        ('{"format": "tunekit-db", "schema": 1, "entries": [{"key": 1, "key": 2}]}', "duplicate key 'key'"),
        ('{"format": "tunekit-db", "schema": 1, "entries": []} []', "extra data after the document"),
        ('{"format": "tunekit-db", "schema": 1, "entries": [}', "not valid JSON"),
        ('{"format": "tunekit-db", "schema": 1, "entries": [1 2]}', "expecting ',' or ']'"),
        ('{"format": "tunekit-db" "schema": 1}', "expecting ',' or '}'"),
        ('{"format": "tunekit-db", "schema": 1, "entries": ', "not valid JSON"),
        ('{"format": "tunekit-db", "schema": 1}', "'entries' must be a list"),
        ('{"format": "tunekit-db", "schema": 1, "entries": "x"}', "'entries' must be a list"),
    ],
)
def test_document_syntax_and_duplicate_keys(toy, tmp_path, text, message):
    with pytest.raises(DatabaseError, match=message):
        read_document(_write(tmp_path, text))


def test_a_duplicate_key_inside_an_entry_refuses_the_file(toy, tmp_path):
    """The second "time_ms" would silently win in json.loads: a file that says two things is refused."""
    text = json.dumps(document([toy_entry(toy, fingerprint(), 1.0)]))
    text = text.replace('"best": {', '"best": {"time_ms": 0.5, ', 1)
    with Store() as store, pytest.raises(DatabaseError, match="duplicate key 'time_ms'"):
        import_document(store, _write(tmp_path, text))
    with Store() as store:
        assert len(store) == 0


def test_the_same_key_twice_is_refused_not_counted_twice(toy, tmp_path):
    entry = toy_entry(toy, fingerprint(), 1.0)
    with Store() as store:
        with pytest.raises(DatabaseError, match=r"entry 1: the same key as entry 0 .*each key once"):
            import_document(store, _write(tmp_path, document([entry, toy_entry(toy, fingerprint(), 0.5, block=4)])))
        assert len(store) == 0


def test_a_document_over_the_cap_is_refused_before_it_is_read(toy, tmp_path, monkeypatch):
    sparse = tmp_path / "huge.json"
    with sparse.open("wb") as f:
        f.truncate(document_reader.MAX_DOCUMENT_BYTES + 1)
    monkeypatch.setattr(bounded_file, "read_capped", lambda *a: pytest.fail("read before its size was checked"))
    with pytest.raises(DatabaseError, match=r"huge.json: larger than 64 MiB, the most tunekit reads from one file"):
        read_document(sparse)


def test_a_file_growing_as_it_is_read_is_read_up_to_the_cap_and_refused_there(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(document_reader, "MAX_DOCUMENT_BYTES", 1000)
    path = _write(tmp_path, json.dumps(document([toy_entry(toy, fingerprint(), 1.0)])))
    assert path.stat().st_size < 1000
    real, read = bounded_file.read_capped, []

    def grown(file, limit):  # the file grows past the cap after its size was checked
        with open(path, "a") as f:
            f.write(" " * 5000)
        data = real(file, limit)
        read.append(file.tell())
        return data

    monkeypatch.setattr(bounded_file, "read_capped", grown)
    with pytest.raises(DatabaseError, match=r"larger than 1000 bytes, the most"):
        read_document(path)
    assert read == [1001]  # one byte past the cap, no more


def test_a_document_is_read_with_bounded_memory(toy, tmp_path):
    """Entries are decoded one at a time: peak Python memory stays near the text's size, not the ~9x of a tree."""
    import tracemalloc

    entries = [toy_entry(toy, fingerprint(), 1.0 + i, rows=i) for i in range(1, 1500)]
    path = tmp_path / "big.json"
    write_document(path, entries)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with Store() as store:
            assert import_document(store, path).added == len(entries)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tracemalloc.start()
    try:
        json.loads(path.read_text())
        _, tree_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * size < tree_peak, (peak, size, tree_peak)


# --- atomic export ------------------------------------------------------------------------------------------------


def test_export_on_a_full_disk_leaves_the_previous_file_whole(toy, tmp_path, monkeypatch):
    path = tmp_path / "db.json"
    write_document(path, [toy_entry(toy, fingerprint(), 1.0)])
    before = path.read_bytes()
    real_write = os.write

    def full_disk(fd, data):
        half = bytes(data)[: len(data) // 2]
        if half:
            real_write(fd, half)  # a partial file, as a real full disk leaves it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write_all", full_disk)
    entries = [toy_entry(toy, fingerprint(), 2.0, rows=r) for r in (1, 2, 4)]
    with pytest.raises(DatabaseError, match=r"No space left on device \(the disk is full\); the previous file"):
        write_document(path, entries)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.json"]  # no temporary file left behind


def test_export_never_follows_a_symlink(toy, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "db.json"
    link.symlink_to(target)
    refused = r"refusing to write .*db.json: it is a symbolic link \(to .*precious.txt\), and tunekit never follows"
    with pytest.raises(DatabaseError, match=refused):
        write_document(link, [toy_entry(toy, fingerprint(), 1.0)])
    assert target.read_text() == "keep me" and link.is_symlink()
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere" / "x.json")
    with pytest.raises(DatabaseError, match="symbolic link"):
        write_document(dangling, [])


def test_export_writes_a_new_file_readably_and_replaces_an_old_one_in_place(toy, tmp_path):
    path = tmp_path / "db.json"
    write_document(path, [toy_entry(toy, fingerprint(), 1.0)])
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    path.chmod(0o600)
    assert write_document(path, [toy_entry(toy, fingerprint(), 1.0), toy_entry(toy, H200, 1.0)]) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the old file's mode is kept
    assert len(read_document(path)) == 2
    with pytest.raises(DatabaseError, match=r"cannot write .*: No such file or directory"):
        write_document(tmp_path / "missing" / "db.json", [])
    with pytest.raises(DatabaseError, match="exists and is not a regular file"):
        write_document(tmp_path, [])
