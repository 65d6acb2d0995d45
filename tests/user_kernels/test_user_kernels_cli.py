"""User kernels (tunekit.autotune) in the CLI: show, export, forget and import handle their entries as data; only
`tune --plan` imports a kernel, because the plan names it by import path."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import user_kernel_example as ex
from helpers import cli

import tunekit
from tunekit.store.store import Store

NAME = "user_kernel_example:tunekit_add"
pytestmark = pytest.mark.usefixtures("wide_terminal")  # rich's tables


def _tuned() -> None:
    ex.tunekit_add.forget_memo()
    x, y, out = torch.randn(40), torch.randn(40), torch.empty(40)
    ex.tunekit_add[ex.grid](x, y, out, 40)


def test_show_export_forget_import_a_user_kernels_entries(tmp_path):
    _tuned()
    shown = cli("show", "--no-shipped")
    assert shown.exit_code == 0, shown.output
    assert NAME in shown.output and "1 user-kernel entry" in shown.output and "do not know" not in shown.output
    listed = json.loads(cli("show", "--json", "--kernel", NAME).output)
    assert [e["key"]["kernel"] for e in listed["user_kernels"]] == [NAME]
    db = tmp_path / "db.json"
    assert cli("export", "--kernel", NAME, "-o", str(db)).exit_code == 0
    forgot = cli("forget", "--kernel", NAME)
    assert forgot.exit_code == 0 and "removed 1" in forgot.output and len(Store()) == 0
    imported = cli("import", str(db))
    assert imported.exit_code == 0 and "1 added" in imported.output, imported.output
    again = tunekit.autotune(configs=ex.CONFIGS, key=["n"], do_bench=ex.FakeBench(), name=NAME)(ex.add_kernel)
    again[ex.grid](torch.randn(40), torch.randn(40), torch.empty(40), 40)
    assert again.stats.benchmarks == 0 and again.stats.stored == 1  # served from the imported entry


def test_a_malformed_user_entry_is_refused_in_one_line(tmp_path):
    _tuned()
    db = tmp_path / "db.json"
    cli("export", "-o", str(db))
    doc = json.loads(db.read_text())
    for field, value, error in (
        ("sm_count", 999, "not the device key.device_key names"),
        ("name", {"nested": 1}, "device is a flat record of JSON scalars"),
    ):
        bad = json.loads(json.dumps(doc))
        bad["entries"][0]["device"][field] = value
        db.write_text(json.dumps(bad))
        refused = cli("import", str(db))
        assert refused.exit_code == 1 and error in refused.output and len(Store()) == 1
        assert len(refused.output.strip().splitlines()) == 1


_MODULE = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
add = "not a kernel"
"""


def test_import_show_and_plan_never_import_user_code_but_tune_plan_does(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "marker_kernels.py").write_text(_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    _tuned()
    db = tmp_path / "db.json"
    cli("export", "-o", str(db))
    doc = json.loads(db.read_text())
    entry = doc["entries"][0]
    entry["key"]["kernel"] = "marker_kernels:add"
    db.write_text(json.dumps(doc))
    assert cli("import", str(db)).exit_code == 0
    assert "marker_kernels:add" in cli("show", "--no-shipped").output
    plan = tmp_path / "plan.jsonl"
    problem = entry["key"]["problem"]
    plan.write_text(
        json.dumps({"kernel": "marker_kernels:add", "problem": problem})
        + "\n"
        + json.dumps({"kernel": NAME, "problem": {**problem, "n": 48}})
        + "\n"
    )
    listed = cli("plan", str(plan))
    assert listed.exit_code == 0 and "2 problems" in listed.output, listed.output
    assert not marker.exists() and "marker_kernels" not in sys.modules
    plan.write_text(json.dumps({"kernel": NAME, "problem": {**problem, "n": 48}}) + "\n")
    tuned = cli("tune", "--plan", str(plan))
    assert tuned.exit_code == 0 and f"{NAME} " in tuned.output and "measured 3 configs" in tuned.output, tuned.output
    assert "already tuned" in cli("tune", "--plan", str(plan)).output
    queued = cli("tune", "--plan", str(plan), "--submit", "--storage", str(tmp_path / "queue.db"))
    assert queued.exit_code == 0 and "1 jobs queued" in queued.output, queued.output  # a fleet worker tunes it
    named = cli("tune", "--plan", str(plan.with_name("other.jsonl")))
    assert named.exit_code == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"kernel": "marker_kernels:add", "problem": problem}) + "\n")
    refused = cli("tune", "--plan", str(bad))  # named explicitly: imported, and not a tunekit.autotune kernel
    assert refused.exit_code == 1 and "not a kernel decorated with tunekit.autotune" in refused.output
    assert marker.exists()
    monkeypatch.delitem(sys.modules, "marker_kernels")
