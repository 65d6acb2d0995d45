"""Shipped entries recorded under another Triton version: served after one check in this process, recorded, never
checked again (tunekit/runtime/version_policy.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import cli, make_entry

from tunekit.core.device import fingerprint
from tunekit.runtime import version_policy
from tunekit.runtime.dispatch import dispatcher, resolve
from tunekit.store.key import CacheKey

KEY = (8, 32, "float32")


@pytest.fixture
def shipped_elsewhere(toy, monkeypatch):
    """A shipped toy entry recorded on this device's hardware under Triton 0.9.0 (and one under another device)."""
    old = replace(fingerprint(), triton_version="0.9.0")
    other = replace(fingerprint(), name="another-cpu", triton_version="0.9.0")
    shipped = {}
    for device, block in ((old, 8), (other, 4)):
        entry = make_entry(device, 1.0, block, dict(zip(toy.problem_fields, KEY)))
        key = CacheKey.make("toy", toy.source_hash, device.key, dict(entry.key.problem))
        shipped[key] = replace(entry, key=key)

    def shipped_entries():
        return shipped

    shipped_entries.cache_clear = lambda: None  # type: ignore[attr-defined]  (reset_all clears the real one's)
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", shipped_entries)
    monkeypatch.setattr("tunekit.store.database.shipped_entries", shipped_entries)
    return shipped


def test_served_after_one_check_then_never_checked_again(toy, shipped_elsewhere, monkeypatch):
    checks = []
    real = version_policy.check
    monkeypatch.setattr(version_policy, "check", lambda *a: checks.append(a) or real(*a))
    d = dispatcher("toy")
    assert d.config(KEY)["BLOCK"] == 8 and d.served_by[KEY] == "shipped"
    assert len(checks) == 1
    recorded = json.loads(version_policy.verdicts_path().read_text())["verdicts"]
    (verdict,) = recorded.values()
    assert verdict["served"] and verdict["from_triton"] == "0.9.0" and "correct here" in verdict["reason"]
    d.clear()  # a new process: the verdict is read back, not measured again
    assert d.config(KEY)["BLOCK"] == 8 and len(checks) == 1


def test_a_wrong_config_is_refused_and_recorded(toy, shipped_elsewhere, monkeypatch):
    monkeypatch.setattr(
        "tunekit.tuning.verify.verify_config", lambda *a, **k: "output 0: max abs error 1 over tolerance"
    )
    spec, problem = toy, dict(zip(toy.problem_fields, KEY))
    assert resolve(spec, problem, fingerprint(), None).layer != "shipped"
    (verdict,) = json.loads(version_policy.verdicts_path().read_text())["verdicts"].values()
    assert not verdict["served"] and verdict["reason"].startswith("wrong here: output 0")


def test_never_and_show_run_no_check(toy, shipped_elsewhere, monkeypatch):
    monkeypatch.setattr(version_policy, "check", lambda *a: pytest.fail("no check here"))
    problem = dict(zip(toy.problem_fields, KEY))
    monkeypatch.setenv("TUNEKIT_OTHER_TRITON", "never")
    assert resolve(toy, problem, fingerprint(), None).layer != "shipped"
    monkeypatch.delenv("TUNEKIT_OTHER_TRITON")
    result = cli("show", "-k", "toy", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "Triton 0.9.0 entry: checked under Triton" in result.output and "on first use" in result.output
    assert not version_policy.verdicts_path().exists()


def test_a_malformed_verdict_file_is_checked_again(toy, shipped_elsewhere):
    version_policy.verdicts_path().parent.mkdir(parents=True, exist_ok=True)
    version_policy.verdicts_path().write_text('{"format": "tunekit-other-triton", "verdicts": {"x": 3}}')
    assert dispatcher("toy").config(KEY)["BLOCK"] == 8
    assert len(json.loads(version_policy.verdicts_path().read_text())["verdicts"]) == 2


def test_no_check_while_a_graph_is_traced(toy, shipped_elsewhere, monkeypatch):
    monkeypatch.setattr(version_policy, "check", lambda *a: pytest.fail("no check while tracing"))
    monkeypatch.setattr("torch.compiler.is_compiling", lambda: True)
    assert resolve(toy, dict(zip(toy.problem_fields, KEY)), fingerprint(), None).layer != "shipped"
    assert not version_policy.verdicts_path().exists()  # nothing recorded: a later miss outside checks it


def test_a_checked_entry_carries_the_times_and_the_timer_of_its_check(toy, shipped_elsewhere, monkeypatch):
    """The config and torch's op timed here by the default timer: the entry served holds those times and that
    timer's stamp, not its record's (an earlier method's stamp would send a launch-bound entry to torch)."""
    from tunekit.store.entry import GPU_TIMER, SUPERSEDED_TIMERS, TORCH_MS

    stamp = sorted(SUPERSEDED_TIMERS)[0]
    for key, entry in list(shipped_elsewhere.items()):
        shipped_elsewhere[key] = replace(entry, provenance={**entry.provenance, "timer": stamp})
    monkeypatch.setattr(version_policy, "check", lambda *a: version_policy.Verdict(True, "faster here", 0.02, 0.05))
    problem = dict(zip(toy.problem_fields, KEY))
    served = version_policy.checked_entry(toy, problem, fingerprint(), shipped_elsewhere)
    assert served is not None and served.time_ms == 0.02
    assert served.provenance[TORCH_MS] == 0.05 and served.provenance["timer"] == GPU_TIMER
