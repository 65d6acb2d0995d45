"""Bounded cost: a valid import of 20k entries for another device made `tunekit show` take 4 min 43 s
(quadratic: each problem's nearest-entry scan read every entry) and each new op key 1.2-1.8 s instead of 0.01 s;
100 crafted rows under the payload cap made one op call use 3.3 GB. `show` and the nearest-entry scan index
entries by (kernel, device), so their cost grows with what is relevant, and the scan never decodes trials.

The tests count what is decoded and scanned, never seconds: tests/gpu/store_scale_bench.py times the same work."""

from __future__ import annotations

import json
import sqlite3

from fingerprints import H200
from helpers import cli, toy_entry

from tunekit.core.device import fingerprint
from tunekit.runtime.dispatch import resolve
from tunekit.store import payload as payload_mod
from tunekit.store import store as store_mod
from tunekit.store.store import DB_NAME, Store


def plant_many(toy, device, count: int, trials: int = 1) -> None:
    """`count` valid entries of the toy kernel on `device`, written in one statement (put is one transaction each)."""
    rows = []
    for i in range(count):
        entry = toy_entry(toy, device, 1.0 + i, rows=8 + i)
        data = entry.to_json()
        data["trials"] = data["trials"] * trials
        rows.append((entry.key.digest, float(i), json.dumps(data)))
    Store().put(toy_entry(toy, fingerprint(), 5.0, rows=1))  # the table, and one entry of this device
    with sqlite3.connect(Store().directory / DB_NAME) as conn:
        conn.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", rows)


def _decodes(monkeypatch) -> list[int]:
    calls = [0]
    parse = payload_mod.parse_payload

    def counting(digest, raw):
        calls[0] += 1
        return parse(digest, raw)

    monkeypatch.setattr(store_mod, "parse_payload", counting)
    return calls


def test_a_new_key_does_not_decode_other_devices_entries(toy, monkeypatch):
    plant_many(toy, H200, 2000)
    calls = _decodes(monkeypatch)
    store = Store()
    for rows in (3, 5, 7):  # three new keys on this device
        resolve(toy, {"rows": rows, "cols": 32, "dtype": "float32"}, fingerprint(), store)
    assert calls[0] <= 10, f"{calls[0]} payloads decoded for three new keys"


def test_show_is_linear_in_the_store(toy, monkeypatch):
    """Each listed problem's resolution looks at the entries of its kernel on this device, not at every entry."""

    from tunekit.runtime import dispatch

    plant_many(toy, H200, 1500)
    scanned = [0]
    nearest = dispatch.nearest_entry

    def counting(spec, problem, device, candidates):
        candidates = list(candidates)
        scanned[0] += len(candidates)
        return nearest(spec, problem, device, candidates)

    monkeypatch.setattr(dispatch, "nearest_entry", counting)
    result = cli("show", "--no-shipped", "--json", "--all-devices")  # the other device's too: the costly listing
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["entries"]) == 1501
    assert scanned[0] <= 10 * 1501, f"{scanned[0]} candidates scanned to show 1501 entries"


def test_the_nearest_scan_skips_rows_larger_than_tunekit_writes(toy, monkeypatch):
    """Rows of this kernel and device holding megabytes of trials: the scan never loads them (their own key still
    serves them), and what it keeps holds no trials."""
    plant_many(toy, fingerprint(), 5, trials=10_000)  # ~2 MiB each
    plant_many(toy, fingerprint(), 3, trials=10)
    sizes: list[int] = []
    parse = payload_mod.parse_payload
    monkeypatch.setattr(store_mod, "parse_payload", lambda d, raw: (sizes.append(len(raw)), parse(d, raw))[1])
    store = Store()
    resolve(toy, {"rows": 3, "cols": 32, "dtype": "float32"}, fingerprint(), store)
    assert sizes and max(sizes) <= store_mod.MAX_SCOPE_PAYLOAD_CHARS, max(sizes)
    assert all(not e.trials for e in store.scope_entries("toy", fingerprint().key))


def test_crafted_large_rows_cost_an_op_call_little(toy, monkeypatch):
    """Rows of this kernel and device whose best, device or provenance (not their trials) hold megabytes: the scan
    skips them unread."""
    from crafting import plant

    Store().put(toy_entry(toy, fingerprint(), 5.0, rows=1))
    for i in range(5):
        data = toy_entry(toy, fingerprint(), 1.0, rows=100 + i).to_json()
        data["provenance"]["pad"] = "x" * (2 << 20)
        plant(f"crafted{i}", json.dumps(data))
    sizes: list[int] = []
    parse = payload_mod.parse_payload
    monkeypatch.setattr(store_mod, "parse_payload", lambda d, raw: (sizes.append(len(raw)), parse(d, raw))[1])
    resolve(toy, {"rows": 3, "cols": 32, "dtype": "float32"}, fingerprint(), Store())
    assert max(sizes) < 5000, max(sizes)
