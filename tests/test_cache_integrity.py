"""A cache never lies: corrupted, truncated, foreign or newer-schema data is detected, said once, and not served.

Dispatch falls back to the next layer (shipped, nearest, heuristic) and never raises in user code; entries of
another kernel source or Triton version stay in the store but are served to nobody.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store import make_entry
from typer.testing import CliRunner

from tunekit import store as store_mod
from tunekit.cache_key import CacheKey
from tunekit.device import fingerprint
from tunekit.dispatch import dispatcher, reset_all, resolve
from tunekit.entry import Entry, TrialRecord
from tunekit.store import Store

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


@pytest.mark.parametrize("mode", ["garbage", "truncated", "header", "pages", "empty"])
def test_a_corrupted_store_file_is_never_served_and_dispatch_falls_back(toy, isolated_cache, caplog, mode):
    entries = [_entry(toy, block=8)] + [
        _entry(toy, block=4, problem={"rows": 2**k, "cols": 32, "dtype": "float16"}) for k in range(40)
    ]
    with Store() as store:
        for e in entries:
            store.put(e)
    assert _served() == ({"BLOCK": 8, "variant": "a", "num_warps": 4}, "cache")
    _corrupt(isolated_cache / "cache.db", mode)
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        config, layer = _served()
    # the right entry (its page survived) or the fallback: never another config, never an exception
    assert (config, layer) in [(dict(entries[0].config), "cache"), (toy.heuristic(PROBLEM, fingerprint()), "heuristic")]
    if mode in ("garbage", "truncated", "header", "pages"):
        assert layer == "heuristic"
        messages = [r.getMessage() for r in caplog.records]
        assert any(str(isolated_cache) in m for m in messages), messages
        assert len(messages) <= 2  # said once, not once per entry


def test_the_cli_reports_a_corrupted_store_in_one_line(toy, isolated_cache):
    from tunekit.cli import app

    with Store() as store:
        store.put(_entry(toy))
    _corrupt(isolated_cache / "cache.db", "garbage")
    result = CliRunner().invoke(app, ["show"])
    assert result.exit_code == 1
    assert "cannot open the cache store" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_a_damaged_payload_file_is_skipped(toy, isolated_cache, caplog, damage):
    """Large payloads live in files beside the database: damage there is a skipped entry, not an exception."""
    many = tuple(
        TrialRecord({"BLOCK": 8, "variant": "a", "num_warps": 4, "pad": "x" * 80, "n": n}, "ok", 1.0 + n)
        for n in range(400)
    )
    big = _entry(toy, trials=many)
    with Store() as store:
        store.put(big)
    files = [p for p in isolated_cache.rglob("*.val")]
    assert len(files) == 1  # stored as a file by diskcache (it is larger than 32 KiB)
    if damage == "garbage":
        files[0].write_bytes(b"\xff\xfe" + os.urandom(2000))
    elif damage == "truncated":
        files[0].write_bytes(files[0].read_bytes()[:1000])
    else:
        files[0].unlink()
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        with Store() as store:
            assert store.get(big.key) is None
            assert list(store.entries()) == []
        assert _served() == (toy.heuristic(PROBLEM, fingerprint()), "heuristic")
    if damage != "missing":
        assert any("skipping cache entry" in r.getMessage() or "unreadable" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------ entries that lie


def _plant(key_digest: str, payload: object) -> None:
    with Store() as store:
        store._cache.set(key_digest, payload if isinstance(payload, str) else json.dumps(payload))


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


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.lists(st.sampled_from(["key", "best", "config", "problem", "trials", 0, "time_ms"]), max_size=3),
    value=json_values,
)
def test_fuzzed_payloads_never_raise_and_only_valid_configs_are_served(toy, path, value):
    """Any JSON spliced anywhere into a stored payload: the store and dispatch never raise; what is served is
    this entry's config or the fallback."""
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
    _plant(entry.key.digest, data)
    with Store() as store:
        got = store.get(entry.key)
        list(store.entries())
    assert got is None or toy.space.check_membership(got.config) == got.config
    config, layer = _served()
    assert layer in ("cache", "heuristic")
    toy.space.check_membership(config)


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
