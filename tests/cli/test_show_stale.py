"""`tunekit show` and `show --json` on a store after an upgrade renamed a problem field (once KeyError 'cols',
ValueError): entries whose problem is not one the kernel declares today render as stale, never a traceback."""

from __future__ import annotations

import json

import pytest
from fingerprints import H200
from helpers import cli, toy_entry

from tunekit.core.device import fingerprint
from tunekit.store.entry import Entry
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

ODD_PROBLEMS = [
    {"rows": 8, "columns": 32, "dtype": "float32"},  # a renamed field
    {"rows": 8, "dtype": "float32"},  # a removed one
    {"rows": "eight", "cols": 32, "dtype": "float32"},  # a value of another type (a float one: a malformed row)
    {"rows": 8, "cols": 32, "dtype": "float32", "new": True},  # a new one
]


@pytest.mark.parametrize("device", ["here", "other"])
def test_entries_of_other_problem_fields_render_as_stale(toy, device):
    fp = fingerprint() if device == "here" else H200
    good = toy_entry(toy, fp, 1.0)
    with Store() as store:
        store.put(good)
        for problem in ODD_PROBLEMS:
            key = CacheKey.make("toy", "0123456789abcdef", fp.key, problem)
            store.put(Entry(key, good.config, 2.0, good.device, good.provenance, good.trials))
    result = cli("show", "--no-shipped", "--all-devices")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "columns=32" in result.output and "rows=eight" in result.output
    result = cli("show", "--json", "--no-shipped", "--all-devices")
    assert result.exit_code == 0, (result.output, result.exception)
    shown = json.loads(result.output)["entries"]
    assert len(shown) == 1 + len(ODD_PROBLEMS)
    odd = [e for e in shown if e["problem"] in ODD_PROBLEMS]
    assert len(odd) == len(ODD_PROBLEMS) and not any(e["servable_here"] for e in odd)
    if device == "here":
        assert all(e["why_not_served"].startswith("stale") for e in odd)
