"""Issue 44, items 1, 7 and 8 for tunekit's own kernels: nothing imported or shipped is served unchecked, the
other-Triton verdict is the config's, and a demotion stays with its problem.

- An entry that comes from an import, a shipped database or pack, or another Triton version is served only after
  its config passed the kernel's reference here once; the verdict is recorded under the config's digest, so a swapped
  config is checked again.
- An import never overwrites a local trial record, never makes best a config local trials marked wrong or failed,
  and an import reported as "left as they were" writes nothing.
- A demotion (shipped or local) stays with its problem across imports and new tunes; a merge never moves `demoted`
  onto the winner from the losing side.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
from helpers import toy_entry

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.runtime import version_policy
from tunekit.runtime.dispatch import TORCH, dispatcher, resolve
from tunekit.store.database import import_document, read_shipped, write_document
from tunekit.store.entry import DEMOTED, Entry, TrialRecord, demoted, merge_entries
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

TOY_KEY = (8, 32, "float32")
TOY_PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


def toy_resolution(toy):
    with Store() as store:
        return resolve(toy, TOY_PROBLEM, fingerprint(), store)


def imported(tmp_path, *entries: Entry, name: str = "db.json"):
    path = tmp_path / name
    write_document(path, entries)
    with Store() as store:
        return import_document(store, path)


# ------------------------------------------------------------------------------------- checked before served


def test_an_imported_wrong_config_is_checked_refused_and_the_next_layer_serves(toy, tmp_path, caplog):
    wrong = toy_entry(toy, fingerprint(), 0.5, variant="wrong")  # the toy's "wrong" variant computes 2x + 1
    wrong = replace(wrong, trials=(TrialRecord(wrong.config, "ok", 0.5),))  # the file says it was measured "ok"
    assert imported(tmp_path, wrong).added == 1
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        served = toy_resolution(toy)
    assert served.layer != "cache" and served.config.get("variant") != "wrong"
    lines = [r.getMessage() for r in caplog.records if "wrong" in r.getMessage() and "imported" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    caplog.clear()
    dispatcher("toy").clear()  # a new process: the refusal is recorded, not checked again
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        assert dispatcher("toy").config(TOY_KEY).get("variant") != "wrong"
    assert not [r for r in caplog.records if "imported" in r.getMessage()]


def test_an_imported_correct_config_is_checked_once_then_served_and_a_swapped_config_is_checked_again(
    toy, tmp_path, monkeypatch
):
    from tunekit.tuning import verify

    checks = []
    real = verify.verify_config
    monkeypatch.setattr(verify, "verify_config", lambda *a, **k: checks.append(a[1]) or real(*a, **k))
    imported(tmp_path, toy_entry(toy, fingerprint(), 1.0, block=16))
    assert toy_resolution(toy).layer == "cache" and len(checks) == 1
    dispatcher("toy").clear()
    assert dispatcher("toy").config(TOY_KEY)["BLOCK"] == 16 and len(checks) == 1  # recorded: not checked again
    imported(tmp_path, toy_entry(toy, fingerprint(), 0.5, block=8), name="faster.json")  # another config
    dispatcher("toy").clear()
    assert dispatcher("toy").config(TOY_KEY)["BLOCK"] == 8 and len(checks) == 2 and checks[-1]["BLOCK"] == 8


def test_a_locally_tuned_entry_is_served_without_a_check(toy, monkeypatch):
    from tunekit.tuning import verify

    monkeypatch.setattr(verify, "verify_config", lambda *a, **k: pytest.fail("a local entry is not checked again"))
    Store().put(toy_entry(toy, fingerprint(), 1.0))
    assert toy_resolution(toy).layer == "cache"


def test_a_shipped_entry_is_checked_once_before_it_is_served(toy, tmp_path, monkeypatch):
    here = fingerprint()
    write_document(
        tmp_path / "device.json",
        [toy_entry(toy, here, 1.0, rows=8, variant="wrong"), toy_entry(toy, here, 1.0, rows=16)],
    )

    def shipped():
        return read_shipped(tmp_path)

    shipped.cache_clear = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", shipped)
    wrong = resolve(toy, TOY_PROBLEM, here, None)
    assert wrong.layer != "shipped" and wrong.config.get("variant") != "wrong"
    right = resolve(toy, {**TOY_PROBLEM, "rows": 16}, here, None)
    assert right.layer == "shipped" and right.config["variant"] == "a"


def test_an_import_never_overwrites_local_records_nor_elects_a_config_they_marked_wrong(toy, tmp_path, caplog):
    here = fingerprint()
    local = toy_entry(toy, here, 2.0, block=16)
    bad = {**local.config, "BLOCK": 8}
    Store().put(replace(local, trials=(*local.trials, TrialRecord(bad, "failed", error="out of resources"))))
    forged = replace(local, config=bad, time_ms=0.5, trials=(TrialRecord(bad, "ok", 0.5),))
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        result = imported(tmp_path, forged)
    assert result.improved == 0 and result.refused == 1
    assert any("failed" in r.getMessage() and "'BLOCK': 8" in r.getMessage() for r in caplog.records)
    stored = Store().get(local.key)
    assert stored is not None and stored.config["BLOCK"] == 16
    assert [t.status for t in stored.trials if t.config == bad] == ["failed"]


def test_a_merge_never_elects_a_best_its_trials_mark_wrong():
    here = fingerprint()
    key = CacheKey.make("toy", "src", here.key, TOY_PROBLEM)
    good = {"BLOCK": 16, "variant": "a", "num_warps": 4}
    bad = {"BLOCK": 8, "variant": "a", "num_warps": 4}
    old = Entry(key, bad, 0.5, here.to_json(), {"imported_from": "x.json"}, (TrialRecord(bad, "ok", 0.5),))
    new = Entry(key, good, 2.0, here.to_json(), {}, (TrialRecord(bad, "wrong", error="x"), TrialRecord(good, "ok", 2)))
    merged = merge_entries(old, new)
    assert merged.config == good and merged.time_ms == 2.0 and "imported_from" not in merged.provenance


def test_imported_trust_marks_are_not_trusted(toy, tmp_path):
    from tunekit.store.entry import MODEL_VERIFIED, config_digest

    entry = toy_entry(toy, fingerprint(), 1.0, variant="wrong")
    forged = replace(entry, provenance={**entry.provenance, MODEL_VERIFIED: config_digest(entry.config)})
    imported(tmp_path, forged)
    stored = Store().get(entry.key)
    assert stored is not None and MODEL_VERIFIED not in stored.provenance
    assert toy_resolution(toy).layer != "cache"


# ------------------------------------------------------------------------------------- other Triton (item 7)


def test_the_other_triton_verdict_is_the_config_s(toy, monkeypatch):
    old = replace(fingerprint(), triton_version="0.9.0")
    entry = toy_entry(toy, old, 1.0, block=8)
    shipped = {entry.key: entry}

    def shipped_entries():
        return shipped

    shipped_entries.cache_clear = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", shipped_entries)
    assert resolve(toy, TOY_PROBLEM, fingerprint(), None).config["BLOCK"] == 8
    shipped[entry.key] = replace(entry, config={**entry.config, "variant": "wrong"})  # swapped after it passed
    served = resolve(toy, TOY_PROBLEM, fingerprint(), None)
    assert served.layer != "shipped" and served.config.get("variant") != "wrong"
    verdicts = json.loads(version_policy.verdicts_path().read_text())["verdicts"]
    assert sorted(v["served"] for v in verdicts.values()) == [False, True]


# ------------------------------------------------------------------------------------- demotion kept by key (item 8)

GEMM = get_spec("gemm")


def gemm_entry(time_ms: float, which: int = 0, **provenance) -> Entry:
    device = fingerprint()
    problem = GEMM.problem_from_shape((24, 48, 32), "float32")
    config = list(GEMM.space.valid_configs(problem, device))[which]
    key = CacheKey.make("gemm", GEMM.source_hash, device.key, problem)
    trials = (TrialRecord(dict(config), "ok", time_ms),)
    return Entry(key, dict(config), time_ms, device.to_json(), {"timer": "fake", **provenance}, trials)


def gemm_layer() -> str:
    entry = gemm_entry(1.0)
    with Store() as store:
        return resolve(GEMM, dict(entry.key.problem), fingerprint(), store).layer


@pytest.fixture
def shipped_demoted(monkeypatch):
    """A shipped (pack) gemm entry on this device, demoted by the pack's model."""
    entry = demoted(gemm_entry(1.0, pack="llama-x"), "the pack's model ran 4% faster without it")
    shipped = {entry.key: entry}

    def shipped_entries():
        return shipped

    shipped_entries.cache_clear = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setattr("tunekit.runtime.dispatch.shipped_entries", shipped_entries)
    monkeypatch.setattr("tunekit.store.database.shipped_entries", shipped_entries)
    return entry


def test_a_shipped_demotion_is_kept_after_an_import(shipped_demoted, tmp_path):
    assert gemm_layer() == "demoted"
    assert imported(tmp_path, gemm_entry(0.5, which=1)).added == 1
    assert gemm_layer() == "demoted"


def test_a_shipped_demotion_is_kept_after_a_new_tune(shipped_demoted):
    Store().put(gemm_entry(0.5, which=1, strategy="tpe"))  # what `tune --shape` stores
    assert gemm_layer() == "demoted"


def test_a_shipped_demotion_is_lifted_once_the_replacing_entry_is_verified_in_the_model(shipped_demoted):
    from tunekit.store.entry import verified_in_model

    Store().put(verified_in_model(gemm_entry(0.5, which=1)))
    assert gemm_layer() == "cache"


def test_a_local_demotion_is_kept_across_an_import_and_a_new_tune(tmp_path):
    from tunekit.store.entry import demotion

    Store().put(demoted(gemm_entry(1.0), "the step ran 5% faster without it"))
    assert gemm_layer() == "demoted"
    assert imported(tmp_path, gemm_entry(0.5, which=1)).improved == 1
    assert gemm_layer() == "demoted"
    Store().put(gemm_entry(0.25, which=2))  # a new tune, faster still
    assert gemm_layer() == "demoted"
    stored = Store().get(gemm_entry(1.0).key)
    assert stored is not None and DEMOTED not in stored.provenance  # the new best is not itself called demoted
    assert demotion(stored) is not None  # the problem's demotion is held until the model verifies the new best


def test_an_import_left_as_it_was_changes_nothing(tmp_path):
    local = gemm_entry(0.5)
    Store().put(local)
    slower_demoted = demoted(gemm_entry(1.0, which=1), "another machine's model ran slower with it")
    result = imported(tmp_path, slower_demoted)
    assert result.kept == 1 and result.changed == 0
    assert Store().get(local.key) == local
    assert gemm_layer() == "cache"


def test_a_merge_never_moves_demoted_onto_the_winner_from_the_losing_side():
    from tunekit.store.entry import demotion

    winner = gemm_entry(0.5)
    loser = demoted(gemm_entry(1.0, which=1), "slower in a model")
    for merged in (merge_entries(winner, loser), merge_entries(loser, winner)):
        assert merged.config == winner.config and DEMOTED not in merged.provenance
    assert demotion(merge_entries(winner, loser)) is None  # an incoming loser's demotion changes nothing
    same = demoted(gemm_entry(1.0), "slower in a model")  # the same config demoted: it is the winner's own
    assert DEMOTED in merge_entries(winner, same).provenance


def test_tune_models_demotion_still_marks_the_stored_entry():
    from tunekit.evaluation import tune_model

    entry = gemm_entry(1.0)
    Store().put(entry)
    problem = ("gemm", GEMM.problem_key(dict(entry.key.problem)))
    tune_model._demote([problem], {problem: "the step ran 5% faster without it"})
    assert gemm_layer() == "demoted"
    with Store() as store:
        assert resolve(GEMM, dict(entry.key.problem), fingerprint(), store).config is TORCH


def test_an_entry_that_cannot_be_checked_now_is_not_served_nor_memoised(toy, tmp_path, monkeypatch):
    """While a graph is captured or traced no check can run: the next layer serves, and the memo keeps nothing, so
    the first call outside checks the entry and serves it."""
    imported(tmp_path, toy_entry(toy, fingerprint(), 1.0, block=16))
    monkeypatch.setattr(version_policy, "_capturing", lambda: True)
    d = dispatcher("toy")
    assert d.config(TOY_KEY)["BLOCK"] != 16 and TOY_KEY not in d.memo
    monkeypatch.setattr(version_policy, "_capturing", lambda: False)
    assert d.config(TOY_KEY)["BLOCK"] == 16 and d.served_by[TOY_KEY] == "cache" and TOY_KEY in d.memo
