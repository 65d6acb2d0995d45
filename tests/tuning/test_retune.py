"""Trial budgets are per problem: a tuned problem measures nothing again, a rerun measures only what is missing,
a larger budget continues from the stored trials, --force measures a fresh budget. Also the Optuna studies a person
reads in optuna-dashboard: named by kernel and problem, with each parameter's real value."""

from __future__ import annotations

import json

import optuna
import pytest
from helpers import cli

from tunekit.core.device import fingerprint
from tunekit.store.key import CacheKey
from tunekit.store.store import Store
from tunekit.tuning.tune_types import ALREADY_TUNED, TuneOptions
from tunekit.tuning.tuner import tune
from tunekit.tuning.verify import InProcessBench

PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


@pytest.fixture
def measurements(monkeypatch):
    """Every measurement the tuner makes in this process (verify-and-time, and re-times of the best)."""
    calls: list[str] = []
    measure, retime = InProcessBench.measure, InProcessBench.retime

    def counted_measure(self, config, verify_seed):
        calls.append("measure")
        return measure(self, config, verify_seed)

    def counted_retime(self, config):
        calls.append("retime")
        return retime(self, config)

    monkeypatch.setattr(InProcessBench, "measure", counted_measure)
    monkeypatch.setattr(InProcessBench, "retime", counted_retime)
    return calls


def tune_json(*args: str) -> dict:
    result = cli("tune", "-k", "toy", "-s", "8x32", "--sampler", "random", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def stored_trials() -> int:
    with Store() as store:
        (entry,) = store.entries()
    return len(entry.trials)


def test_tuning_a_tuned_problem_measures_nothing(toy, measurements):
    first = tune_json("--trials", "5")["results"][0]
    assert first["status"] == "tuned" and first["measured"] == 5 and measurements
    measurements.clear()
    second = tune_json("--trials", "5")["results"][0]
    assert measurements == []  # nothing verified, timed or re-timed
    assert second["status"] == "already tuned" and second["measured"] == 0
    assert second["config"] == first["config"] and second["time_ms"] == first["time_ms"]
    assert stored_trials() == 5


def test_a_larger_budget_continues_from_the_stored_trials(toy, measurements):
    tune_json("--trials", "3")
    measurements.clear()
    result = tune_json("--trials", "5")["results"][0]
    assert result["measured"] == 2 and result["stored_before"] == 3 and result["stored_trials"] == 5
    assert measurements.count("measure") == 2
    assert stored_trials() == 5


def test_force_measures_a_fresh_budget_of_new_configs(toy):
    tune_json("--trials", "3")
    result = tune_json("--trials", "3", "--force")["results"][0]
    assert result["status"] == "tuned" and result["measured"] == 3 and result["stored_trials"] == 6


def test_a_rerun_after_an_interruption_measures_only_what_is_missing(toy):
    device = fingerprint()
    key = CacheKey.make("toy", toy.source_hash, device.key, PROBLEM)

    def stop_after_two(record, n):
        return n >= 2  # the caller has seen enough: as if the run was killed after its second measurement

    with Store() as store:
        tune(
            toy, PROBLEM, device, TuneOptions(trials=6, sampler="random"), on_trial=stop_after_two, checkpoint=store.put
        )
        saved = store.get(key)
        assert saved is not None and len(saved.trials) == 2
        rerun = tune(toy, PROBLEM, device, TuneOptions(trials=6, sampler="random"), previous=saved)
    assert rerun.stored_trials == 2 and rerun.budget == 4 and rerun.benchmarked == 4
    assert len(rerun.entry.trials) == 6
    before = {json.dumps(t.config, sort_keys=True) for t in saved.trials}
    assert not before & {json.dumps(r.config, sort_keys=True) for r in rerun.records}


def test_a_tuned_problem_returns_its_stored_entry_without_a_bench(toy, monkeypatch):
    device = fingerprint()
    first = tune(toy, PROBLEM, device, TuneOptions(trials=4, sampler="random"))

    def no_bench(*args, **kwargs):
        raise AssertionError("a bench was started for a tuned problem")

    monkeypatch.setattr("tunekit.tuning.tuner.InProcessBench", no_bench)
    again = tune(toy, PROBLEM, device, TuneOptions(trials=4, sampler="random"), previous=first.entry)
    assert again.skipped and again.stop_reason == ALREADY_TUNED and again.entry == first.entry


def test_study_trials_count_against_the_budget(toy, tmp_path):
    """Stored trials in the Optuna storage count too, even without a cache entry: nothing is measured twice."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    device = fingerprint()
    tune(toy, PROBLEM, device, TuneOptions(trials=4, sampler="random", storage=url))
    again = tune(toy, PROBLEM, device, TuneOptions(trials=4, sampler="random", storage=url))
    assert again.benchmarked == 0 and again.stop_reason == ALREADY_TUNED


def test_studies_are_named_by_kernel_and_problem_with_real_parameter_values(toy, tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=4, sampler="random", storage=url))
    (name,) = optuna.get_all_study_names(url)
    assert name.startswith("tunekit toy rows=8 cols=32 dtype=float32 | device ")
    study = optuna.load_study(study_name=name, storage=url)
    measured = [t for t in study.trials if "tunekit" in t.user_attrs]
    assert measured
    for trial in measured:
        assert trial.user_attrs["BLOCK"] == 2 ** trial.params["log2_BLOCK"]  # the real value beside the exponent
        assert trial.user_attrs["variant"] == trial.params["variant"]
