"""The databases shipped in cache/ are valid tuning databases, and dispatch serves them only on their device."""

from __future__ import annotations

import pytest
from helpers import ROOT

from tunekit.core.device import fingerprint
from tunekit.store.database import read_document, shipped_entries

SHIPPED = sorted((ROOT / "cache").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_database_is_valid(path):
    entries = read_document(path)
    assert entries
    assert len({e.key.device_key for e in entries}) == 1  # one database per device
    assert all(e.provenance.get("timer") == "cuda-events-median-l2-flushed" for e in entries)


def test_shipped_entries_are_loaded_but_not_served_on_another_device():
    loaded = shipped_entries()
    assert len(loaded) == sum(len(read_document(p)) for p in SHIPPED)
    assert all(key.device_key != fingerprint().key for key in loaded)  # here: the interpreter


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_entries_match_the_current_kernel_sources(path):
    """A change of a kernel's identity (its jit code, space values or version) retires its shipped entries
    silently at run time; here it fails loudly instead. Re-tune the kernel on that device and re-export.
    Reformatting and moving code keep the identity (tests/core/test_identity.py)."""
    from tunekit.core.registry import get_spec

    stale = sorted(
        {e.key.kernel for e in read_document(path) if e.key.source_hash != get_spec(e.key.kernel).source_hash}
    )
    assert not stale, f"{path.name}: entries measured with older sources of {stale}"
