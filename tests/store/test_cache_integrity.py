"""A cache never lies: corrupted, truncated, foreign or newer-schema data is detected, said once, and not served.

Dispatch falls back to the next layer (shipped, nearest, heuristic) and never raises in user code; entries of
another kernel source or Triton version stay in the store but are served to nobody.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
from crafting import plant
from helpers import cli, make_entry
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store import Pickled

from tunekit.core.device import fingerprint
from tunekit.runtime.dispatch import dispatcher, reset_all, resolve
from tunekit.store import store as store_mod
from tunekit.store.entry import Entry
from tunekit.store.key import CacheKey
from tunekit.store.store import DB_NAME, Store

KEY = (8, 32, "float32")
PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


@pytest.fixture(autouse=True)
def fresh_warnings():
    store_mod._warned.clear()  # each warning is said once per process: let every test see its own
    yield
    store_mod._warned.clear()


def _entry(toy, block=8, problem=PROBLEM, source_hash=None, device=None, trials=None) -> Entry:
    device = device or fingerprint()
    e = make_entry(device, 1.0, block, problem)
    key = CacheKey.make("toy", source_hash or toy.source_hash, device.key, problem)
    return Entry(key, e.config, e.time_ms, e.device, e.provenance, trials if trials is not None else e.trials)


def _served(key=KEY):
    """What dispatch serves for `key` in a fresh process state: (config, layer). Must never raise."""
    reset_all()
    d = dispatcher("toy")
    return dict(d.config(key)), d.served_by[key]


# ------------------------------------------------------------------------------------------ the store's file


def _corrupt(path: Path, mode: str) -> None:
    data = path.read_bytes()
    n = len(data)
    if mode == "garbage":
        path.write_bytes(os.urandom(n))
    elif mode == "truncated":
        path.write_bytes(data[: n // 2])
    elif mode == "header":
        path.write_bytes(b"\0" * 100 + data[100:])
    elif mode == "pages":  # the header survives, so the store opens; reads of the damaged pages fail
        path.write_bytes(data[:4096] + os.urandom(n - 4096))
    elif mode == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize("mode", ["garbage", "truncated", "header", "pages"])
def test_a_corrupted_store_file_is_never_served_and_dispatch_falls_back(toy, isolated_cache, caplog, mode):
    entries = [_entry(toy, block=8)] + [
        _entry(toy, block=4, problem={"rows": 2**k, "cols": 32, "dtype": "float16"}) for k in range(40)
    ]
    with Store() as store:
        for e in entries:
            store.put(e)
    assert _served() == ({"BLOCK": 8, "variant": "a", "num_warps": 4}, "cache")
    _corrupt(isolated_cache / DB_NAME, mode)
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        config, layer = _served()
    assert (config, layer) == (toy.heuristic(PROBLEM, fingerprint()), "heuristic")  # never another config
    messages = [r.getMessage() for r in caplog.records]
    assert any(str(isolated_cache) in m for m in messages), messages
    assert len(messages) <= 2  # said once, not once per entry


def test_an_emptied_store_file_is_an_empty_store(toy, isolated_cache, caplog):
    """A store file truncated to 0 bytes is an empty SQLite database: nothing served, nothing said, and the next
    write makes it a store again."""
    with Store() as store:
        store.put(_entry(toy, block=8))
    _corrupt(isolated_cache / DB_NAME, "empty")
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        assert _served() == (toy.heuristic(PROBLEM, fingerprint()), "heuristic")
        with Store() as store:
            assert list(store.entries()) == [] and len(store) == 0
            store.put(_entry(toy, block=16))
        assert _served() == ({"BLOCK": 16, "variant": "a", "num_warps": 4}, "cache")
    assert caplog.records == []


def test_the_cli_reports_a_corrupted_store_in_one_line(toy, isolated_cache):

    with Store() as store:
        store.put(_entry(toy))
    _corrupt(isolated_cache / DB_NAME, "garbage")
    result = cli("show")
    assert result.exit_code == 1
    assert "cannot open the cache store" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------------------ entries that lie


def _plant(key_digest: object, payload: object) -> None:
    plant(key_digest, payload if isinstance(payload, (str, bytes, int, float)) else json.dumps(payload))


def test_an_entry_of_a_newer_schema_is_skipped_with_a_clear_message(toy, caplog):
    entry = _entry(toy, block=8)
    newer = entry.to_json()
    newer["key"]["schema"] = 2
    newer["key"]["problem"]["layout"] = "new-field"  # a newer tunekit may key on more
    newer_digest = CacheKey.from_json(newer["key"]).digest
    _plant(newer_digest, newer)
    _plant(entry.key.digest, newer)  # even under this schema's digest
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        with Store() as store:
            assert store.get(entry.key) is None and list(store.entries()) == []
        assert _served() == (toy.heuristic(PROBLEM, fingerprint()), "heuristic")  # not even as 'nearest'
    assert any("newer tunekit (schema 2; this one reads 1): upgrade tunekit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda d: d["best"]["config"].update(BLOCK=3), "outside the toy space"),
        (lambda d: d["best"]["config"].pop("variant"), "outside the toy space"),
        (lambda d: d["best"]["config"].update(BLOCK="8"), "outside the toy space"),
        (lambda d: d["best"]["config"].update(BLOCK=[8]), "best config must map names"),
        (lambda d: d["best"].update(time_ms=float("nan")), "best time must be a finite number"),
        (lambda d: d["best"].update(time_ms="fast"), "best time must be a finite number"),
        (lambda d: d.update(trials={"a": 1}), "trials must be a list"),
        (lambda d: d["trials"].append({"status": "great", "config": {}}), "a trial is not"),
        (lambda d: d["key"].update(kernel=7), "kernel, source_hash and device_key must be strings"),
        (lambda d: d.pop("device"), "device and provenance must be objects"),
        (lambda d: d["key"]["problem"].update(rows=16), "stored under another key's digest"),
    ],
)
def test_an_entry_that_lies_is_never_served(toy, caplog, mutate, reason):
    """Decodable JSON that is not a valid entry of this key and space: skipped with its reason, dispatch falls back."""
    entry = _entry(toy, block=8)
    data = entry.to_json()
    mutate(data)
    _plant(entry.key.digest, data)
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        with Store() as store:
            assert store.get(entry.key) is None
        assert _served() == (toy.heuristic(PROBLEM, fingerprint()), "heuristic")
    assert any(reason in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


PICKLE, JSON_BLOB = object(), object()  # raw payloads built per test (they need its marker path and entry)


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.lists(st.sampled_from(["key", "best", "config", "problem", "trials", 0, "time_ms"]), max_size=3),
    value=json_values,
    raw=st.none()
    | st.none()
    | st.binary(max_size=48)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)  # what an SQLite INTEGER can hold
    | st.floats(allow_nan=False)  # SQLite stores NaN as NULL, which the payload column refuses
    | st.text(max_size=16)
    | st.sampled_from([PICKLE, JSON_BLOB]),
    digest_kind=st.sampled_from(["right", "right", "right", "blob", "int", "another"]),
)
def test_fuzzed_payloads_never_raise_and_only_valid_configs_are_served(
    toy, tmp_path, isolated_cache, path, value, raw, digest_kind
):
    """Any JSON spliced anywhere into a stored payload, or a payload that is not JSON text at all (a blob, a
    pickle whose loading writes a marker file, a number, the entry's JSON as a blob), under its digest or under a
    key that is not its own: the store and dispatch never raise, never unpickle, and serve this entry's config,
    only from valid JSON text under its own digest, or the fallback."""
    marker = tmp_path / "unpickled"
    entry = _entry(toy, block=8)
    data = entry.to_json()
    node = data
    for step in path[:-1]:
        nxt = node[step] if isinstance(node, dict) and step in node else None
        if isinstance(step, int) and isinstance(node, list) and node:
            nxt = node[0]
        if not isinstance(nxt, (dict, list)):
            break
        node = nxt
    if path and isinstance(node, dict):
        node[str(path[-1])] = value
    elif path and isinstance(node, list) and node:
        node[0] = value
    else:
        data = value
    payload: object = json.dumps(data)
    if raw is PICKLE:
        payload = pickle.dumps(Pickled(marker))
    elif raw is JSON_BLOB:
        payload = json.dumps(entry.to_json()).encode()
    elif raw is not None:
        payload = raw
    digest: object = {
        "right": entry.key.digest,
        "blob": entry.key.digest.encode(),
        "int": 7,
        "another": _entry(toy, block=8, problem={**PROBLEM, "rows": 1}).key.digest,
    }[digest_kind]
    shutil.rmtree(isolated_cache, ignore_errors=True)  # each example starts from an empty store
    _plant(digest, payload)
    with Store() as store:
        got = store.get(entry.key)
        listed = list(store.entries())
    assert got is None or toy.space.check_membership(got.config) == got.config
    assert all(e.key.digest == entry.key.digest for e in listed)
    if raw is not None or digest_kind != "right":
        assert got is None and listed == []
    config, layer = _served()
    assert layer in ("cache", "heuristic")
    assert layer == "heuristic" or got is not None
    toy.space.check_membership(config)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ source and Triton


def test_entries_of_another_kernel_source_or_triton_are_kept_but_never_served(toy):
    device = fingerprint()
    old_source = _entry(toy, block=8, source_hash="0ld50urce0ld50ur")
    new_triton = dataclasses.replace(device, triton_version="99.0.0")
    other_triton = _entry(toy, block=16, device=new_triton)
    with Store() as store:
        store.put(old_source)
        store.put(other_triton)
        current = CacheKey.make("toy", toy.source_hash, device.key, PROBLEM)
        assert resolve(toy, PROBLEM, device, store).layer == "heuristic"  # neither as 'cache' nor as 'nearest'
        assert {e.key.digest for e in store.entries()} == {old_source.key.digest, other_triton.key.digest}
        related = store.related(current)
        assert [e.key.digest for e in related] == [old_source.key.digest, other_triton.key.digest]  # same device 1st
    assert _served() == (toy.heuristic(PROBLEM, device), "heuristic")
    with Store() as store:
        store.put(_entry(toy, block=2))
    assert _served() == ({"BLOCK": 2, "variant": "a", "num_warps": 4}, "cache")
