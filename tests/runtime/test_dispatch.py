from __future__ import annotations

import json

import pytest
from helpers import make_entry

from tunekit.core.device import fingerprint
from tunekit.core.errors import CacheMissError
from tunekit.runtime.dispatch import dispatcher, resolve
from tunekit.store.store import Store

KEY = (8, 32, "float32")


@pytest.fixture
def toy_entry(toy):
    def build(time_ms=1.0, block=16, problem=None):
        entry = make_entry(fingerprint(), time_ms, block, problem or dict(zip(toy.problem_fields, KEY)))
        key = type(entry.key).make("toy", toy.source_hash, fingerprint().key, dict(entry.key.problem))
        return type(entry)(key, entry.config, entry.time_ms, entry.device, entry.provenance, entry.trials)

    return build


def test_heuristic_when_nothing_is_tuned(toy):
    d = dispatcher("toy")
    assert d.config(KEY) == toy.heuristic({}, fingerprint())
    assert d.counters == {"heuristic": 1} and d.served_by[KEY] == "heuristic"


def test_cache_layer_then_memo(toy, toy_entry):
    with Store() as store:
        store.put(toy_entry(block=8))
    d = dispatcher("toy")
    assert d.config(KEY)["BLOCK"] == 8
    assert d.config(KEY)["BLOCK"] == 8
    assert d.counters == {"cache": 1} and d.memo_hits == 1


def test_memo_means_no_store_read(toy, toy_entry, monkeypatch):
    d = dispatcher("toy")
    d.config(KEY)
    monkeypatch.setattr(Store, "get", lambda *a: pytest.fail("memo hit must not read the store"))
    for _ in range(3):
        d.config(KEY)
    assert d.memo_hits == 3


def test_shipped_layer(toy, toy_entry, monkeypatch):
    shipped = toy_entry(block=4)
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", lambda: {shipped.key: shipped})
    d = dispatcher("toy")
    assert d.config(KEY)["BLOCK"] == 4 and d.counters == {"shipped": 1}


def test_user_cache_wins_over_shipped(toy, toy_entry, monkeypatch):
    shipped = toy_entry(block=4)
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", lambda: {shipped.key: shipped})
    with Store() as store:
        store.put(toy_entry(block=8))
    assert dispatcher("toy").config(KEY)["BLOCK"] == 8


def test_nearest_tuned_problem_with_a_valid_config(toy, toy_entry):
    with Store() as store:
        store.put(toy_entry(block=32, problem={"rows": 16, "cols": 64, "dtype": "float32"}))
        store.put(toy_entry(block=2, problem={"rows": 1024, "cols": 32, "dtype": "float32"}))
        store.put(toy_entry(block=1, problem={"rows": 8, "cols": 32, "dtype": "float16"}))  # other dtype: never
    d = dispatcher("toy")
    # rows 16/cols 64 is nearest (distance 2) and BLOCK=32 fits cols=32
    assert d.config(KEY)["BLOCK"] == 32 and d.counters == {"nearest": 1}
    # for cols=16, BLOCK=32 breaks the block_fits_row rule: the next nearest valid entry serves
    assert d.config((8, 16, "float32"))["BLOCK"] == 2


def test_resolution_is_deterministic(toy, toy_entry):
    with Store() as store:
        store.put(toy_entry(block=4, problem={"rows": 16, "cols": 32, "dtype": "float32"}))
        store.put(toy_entry(block=8, problem={"rows": 4, "cols": 32, "dtype": "float32"}))  # same distance
        results = {
            resolve(toy, dict(zip(toy.problem_fields, KEY)), fingerprint(), store).config["BLOCK"] for _ in range(5)
        }
    assert len(results) == 1


def test_strict_mode_raises_on_a_miss(toy, toy_entry, monkeypatch):
    monkeypatch.setenv("TUNEKIT_STRICT", "1")
    with pytest.raises(CacheMissError, match="strict mode"):
        dispatcher("toy").config(KEY)
    with Store() as store:
        store.put(toy_entry(block=8))
    assert dispatcher("toy").config(KEY)["BLOCK"] == 8


def test_tune_on_miss_tunes_once_and_caches(toy, monkeypatch):
    monkeypatch.setenv("TUNEKIT_TUNE_ON_MISS", "1")
    monkeypatch.setenv("TUNEKIT_TUNE_ON_MISS_TRIALS", "5")
    d = dispatcher("toy")
    config = d.config(KEY)
    assert d.counters == {"tuned": 1}
    with Store() as store:
        assert len(store) == 1 and next(iter(store.entries())).config == config
    d.clear()
    assert d.config(KEY) == config and d.counters == {"cache": 1}


def test_resolution_does_not_depend_on_what_was_imported(tmp_path):
    """From a fresh interpreter: the same problems resolve to the same layer before and after `import tunekit.ops`
    (whether torch serves an untuned problem, or a shipped entry that torch beat, is the kernel's declaration, not
    a registry the op modules fill when imported). `tunekit show` never imports the ops."""
    import os
    import subprocess
    import sys

    code = """
import json, sys
sys.path.insert(0, 'tests')
from fingerprints import H200
from tunekit.core.registry import get_spec
from tunekit.runtime.dispatch import resolve
from tunekit.store.database import shipped_entries

def layers():
    spec = get_spec('layernorm')
    untuned = spec.problem_from_shape((3001, 4099), 'bfloat16')
    out = [resolve(spec, untuned, H200, None).layer]
    for entry in list(shipped_entries().values())[:60]:
        kernel = get_spec(entry.key.kernel)
        out.append(resolve(kernel, dict(entry.key.problem), H200, None).layer)
    return out

before = layers()
import tunekit.ops  # noqa
print(json.dumps([before, layers()]))
"""
    env = {**os.environ, "TUNEKIT_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    before, after = json.loads(out.strip().splitlines()[-1])
    assert before == after
    assert before[0] == "torch"  # an untuned problem on a GPU: torch's own op
