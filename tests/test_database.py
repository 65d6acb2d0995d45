from __future__ import annotations

import json

import pytest
from test_store import H200, make_entry

from tunekit.cache_key import CacheKey
from tunekit.database import document, export_entries, import_document, read_document, write_document
from tunekit.device import fingerprint
from tunekit.entry import Entry
from tunekit.errors import DatabaseError
from tunekit.store import Store


def toy_entry(toy, device, time_ms, block=16, rows=8):
    e = make_entry(device, time_ms, block, {"rows": rows, "cols": 32, "dtype": "float32"})
    key = CacheKey.make("toy", toy.source_hash, device.key, dict(e.key.problem))
    return Entry(key, e.config, e.time_ms, e.device, e.provenance, e.trials)


def test_export_import_round_trip(toy, tmp_path):
    entries = [toy_entry(toy, fingerprint(), 1.0, rows=8), toy_entry(toy, H200, 0.5, rows=16)]
    with Store(tmp_path / "a") as store:
        for e in entries:
            store.put(e)
        path = tmp_path / "db.json"
        assert write_document(path, export_entries(store)) == 2
    with Store(tmp_path / "b") as other:
        assert import_document(other, path) == (2, 2)
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
        assert import_document(store, path) == (1, 0)
        assert store.get(fast.key).config["BLOCK"] == 32
        write_document(path, [toy_entry(toy, fingerprint(), 0.5, block=4)])
        assert import_document(store, path) == (1, 1)
        kept = store.get(fast.key)
        assert kept.config["BLOCK"] == 4 and kept.provenance["imported_from"] == "db.json"


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
