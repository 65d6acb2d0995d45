"""The databases shipped in cache/ and the model packs in cache/packs/ are valid tuning databases, and dispatch
serves them only on their device."""

from __future__ import annotations

import pytest
from helpers import ROOT

from tunekit.core.device import fingerprint
from tunekit.store.database import read_document, read_shipped, shipped_entries, write_document
from tunekit.store.entry import GPU_TIMER, SUPERSEDED_TIMERS

SHIPPED = sorted((ROOT / "cache").glob("*.json"))
PACKS = sorted((ROOT / "cache" / "packs").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_database_is_valid(path):
    entries = read_document(path)
    assert entries
    assert len({e.key.device_key for e in entries}) == 1  # one database per device
    assert all(e.provenance.get("timer") == GPU_TIMER for e in entries)  # retimed by the current method


@pytest.mark.parametrize("path", PACKS, ids=[p.name for p in PACKS])
def test_model_pack_is_valid_and_names_a_pack_model(path):
    from tunekit.evaluation.model_packs import PACK_MODELS

    entries = read_document(path)
    assert entries and path.stem in PACK_MODELS
    assert all(e.provenance.get("timer") in {GPU_TIMER, *SUPERSEDED_TIMERS} for e in entries)
    assert {e.device.get("name") for e in entries} <= {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}


def test_shipped_entries_are_loaded_but_not_served_on_another_device():
    loaded = shipped_entries()
    assert set(loaded) == {e.key for p in (*SHIPPED, *PACKS) for e in read_document(p)}
    assert all(key.device_key != fingerprint().key for key in loaded)  # here: the interpreter


@pytest.mark.parametrize("path", [*SHIPPED, *PACKS], ids=[p.name for p in (*SHIPPED, *PACKS)])
def test_shipped_entries_match_the_current_kernel_sources(path):
    """A change of a kernel's identity (its jit code, space values or version) retires its shipped entries
    silently at run time; here it fails loudly instead. Re-tune the kernel on that device and re-export.
    Reformatting and moving code keep the identity (tests/core/test_identity.py)."""
    from tunekit.core.registry import get_spec

    stale = sorted(
        {e.key.kernel for e in read_document(path) if e.key.source_hash != get_spec(e.key.kernel).source_hash}
    )
    assert not stale, f"{path.name}: entries measured with older sources of {stale}"


@pytest.fixture
def packed(toy, tmp_path, monkeypatch):
    """A shipped root with a device database and one model pack ("llama-x") of toy entries on this device: the pack
    is faster on rows=8, slower on rows=16, alone on rows=32."""
    from helpers import toy_entry

    here = fingerprint()
    (tmp_path / "packs").mkdir()
    write_document(tmp_path / "device.json", [toy_entry(toy, here, 1.0, rows=8), toy_entry(toy, here, 1.0, rows=16)])
    write_document(
        tmp_path / "packs" / "llama-x.json",
        [toy_entry(toy, here, 0.5, rows=8), toy_entry(toy, here, 2.0, rows=16), toy_entry(toy, here, 1.0, rows=32)],
    )
    (tmp_path / "packs" / "notes.txt").write_text("not a database")

    def shipped():
        return read_shipped(tmp_path)

    shipped.cache_clear = lambda: None  # type: ignore[attr-defined]  (reset_all clears the real one's)
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", shipped)
    monkeypatch.setattr("tunekit.store.database.shipped_entries", shipped)
    return shipped()


def test_a_pack_s_entries_carry_its_name_and_the_fastest_of_a_key_serves(packed):
    by_rows = {dict(e.key.problem)["rows"]: e for e in packed.values()}
    assert sorted(by_rows) == [8, 16, 32]
    assert by_rows[8].time_ms == 0.5 and by_rows[8].provenance["pack"] == "llama-x"
    assert by_rows[16].time_ms == 1.0 and "pack" not in by_rows[16].provenance  # the device database's, faster
    assert by_rows[32].provenance["pack"] == "llama-x"


def test_show_says_which_pack_serves_a_problem(packed, narrow_terminal):
    import json

    from helpers import cli

    served = cli("show", "--kernel", "toy", "--shape", "8x32", "--shape", "16x32")
    assert served.exit_code == 0, served.output
    assert "served by shipped (pack llama-x)" in served.output
    assert served.output.count("served by shipped") == 2  # rows=16: the device database's, no pack named
    listed = json.loads(cli("show", "--kernel", "toy", "--json").stdout)["entries"]
    assert sorted((e["problem"]["rows"], e["pack"]) for e in listed) == [(8, "llama-x"), (16, None), (32, "llama-x")]
    text = cli("show", "--kernel", "toy").output
    assert text.count("shipped (pack llama-x) · ") == 2
