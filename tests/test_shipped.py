"""The databases shipped in cache/ are valid tuning databases, and dispatch serves them only on their device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunekit.database import read_document, shipped_entries
from tunekit.device import fingerprint

SHIPPED = sorted((Path(__file__).parent.parent / "cache").glob("*.json"))


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
