from __future__ import annotations

import dataclasses
import json
import os

import pytest
from fingerprints import H200

from tunekit.cache_key import CacheKey
from tunekit.device import DeviceFingerprint, fingerprint
from tunekit.entry import Entry, TrialRecord
from tunekit.errors import CacheError
from tunekit.store import Store

PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


def make_entry(device: DeviceFingerprint, time_ms: float, block: int = 16, problem=PROBLEM) -> Entry:
    config = {"BLOCK": block, "variant": "a", "num_warps": 4}
    return Entry(
        key=CacheKey.make("toy", "srchash", device.key, problem),
        config=config,
        time_ms=time_ms,
        device=device.to_json(),
        provenance={"strategy": "tpe"},
        trials=(TrialRecord(config, "ok", time_ms), TrialRecord({**config, "variant": "wrong"}, "wrong", error="x")),
    )


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
    entry = make_entry(fingerprint(), 1.0)
    with Store() as store:
        store.put(entry)
        store._cache.set(entry.key.digest, "{not json")
        assert store.get(entry.key) is None
        newer = entry.to_json()
        newer["key"]["schema"] = 99
        store._cache.set(entry.key.digest, json.dumps(newer))
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
