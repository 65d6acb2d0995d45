from __future__ import annotations

import pytest
from toy_kernel import PlantedTimer

from tunekit.core.device import fingerprint
from tunekit.core.errors import TunekitError
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune

PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


def test_exhaustive_finds_planted_best_and_rejects_wrong_and_failed(toy):
    timer = PlantedTimer()
    report = tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=1000, sampler="exhaustive"), timer=timer)
    assert report.entry.config == timer.best
    statuses = {tuple(sorted(t.config.items())): t.status for t in report.entry.trials}
    valid = toy.space.valid_configs(PROBLEM, fingerprint())
    assert len(statuses) == len(valid) == report.benchmarked
    assert report.stop_reason == "space exhausted"
    # the planted-wrong variant is the 'fastest' but every one of its configs is rejected, never timed
    wrong = [c for c in valid if c["variant"] == "wrong"]
    assert all(statuses[tuple(sorted(c.items()))] == "wrong" for c in wrong)
    assert all(tuple(sorted(c.items())) not in timer.calls for c in wrong)


def test_compile_failures_are_recorded_not_retried(toy):
    problem = {"rows": 8, "cols": 64, "dtype": "float32"}
    report = tune(toy, problem, fingerprint(), TuneOptions(trials=1000, sampler="exhaustive"), timer=PlantedTimer())
    failed = [t for t in report.entry.trials if t.status == "failed"]
    assert failed and all(t.config["BLOCK"] == 64 and t.config["variant"] == "b" for t in failed)
    assert all("OutOfResources" in (t.error or "") for t in failed)


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_never_benchmarks_a_config_twice(toy, sampler):
    timer = PlantedTimer()
    report = tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=40, sampler=sampler, seed=3), timer=timer)
    # each config timed once during the search; the top few may be timed once more to confirm the winner
    assert max(timer.calls.values()) <= 2
    assert sum(1 for n in timer.calls.values() if n == 2) <= TuneOptions().remeasure_top
    assert report.benchmarked == len({tuple(sorted(r.config.items())) for r in report.records})


def test_tpe_finds_planted_best_within_budget(toy):
    timer = PlantedTimer()
    report = tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=30, sampler="tpe", seed=0), timer=timer)
    assert report.entry.config == timer.best


def test_previous_trials_are_reused_not_remeasured(toy):
    device = fingerprint()
    first = tune(toy, PROBLEM, device, TuneOptions(trials=6, sampler="random", seed=1), timer=PlantedTimer())
    timer = PlantedTimer()
    second = tune(  # 12: the budget counts the 6 stored trials (tests/tuning/test_retune.py)
        toy, PROBLEM, device, TuneOptions(trials=12, sampler="random", seed=1), timer=timer, previous=first.entry
    )
    before = {tuple(sorted(t.config.items())) for t in first.entry.trials}
    new = {tuple(sorted(r.config.items())) for r in second.records}
    assert not before & new
    assert second.benchmarked == 6 and len(second.entry.trials) == 12


def test_trial_budget_is_honoured(toy):
    report = tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=5, sampler="tpe"), timer=PlantedTimer())
    assert report.benchmarked == 5 and report.stop_reason == "trial budget"


def test_time_budget_is_honoured(toy):
    clock = [0.0]

    class SlowTimer(PlantedTimer):
        def __call__(self, fn, config):
            clock[0] += 1.0  # each measurement costs one fake second
            return super().__call__(fn, config)

    timer = SlowTimer()
    options = TuneOptions(trials=100, timeout_s=4.5)
    report = tune(toy, PROBLEM, fingerprint(), options, timer=timer, clock=lambda: clock[0])
    assert report.stop_reason == "time budget"
    assert len(timer.calls) == 5  # the fifth timing crosses 4.5 s; no sixth config is started


def test_a_time_limit_already_spent_still_measures_one_config(toy):
    """A plan's budget may leave a problem almost no time: it is still answered by one measured config."""
    clock = [0.0]

    def ticking() -> float:  # every reading of the clock takes 10 ms: the limit is spent before the first trial
        clock[0] += 0.01
        return clock[0]

    timer = PlantedTimer()
    report = tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=100, timeout_s=1e-3), timer=timer, clock=ticking)
    assert report.stop_reason == "time budget" and report.benchmarked == 1
    assert report.entry is not None and report.entry.trials[0].status == "ok"


def test_resumes_from_optuna_storage(toy, tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    device = fingerprint()
    first = tune(toy, PROBLEM, device, TuneOptions(trials=4, sampler="random", storage=url), timer=PlantedTimer())
    timer = PlantedTimer()
    # trials=8: the budget counts the study's 4 stored trials (tests/tuning/test_retune.py)
    second = tune(toy, PROBLEM, device, TuneOptions(trials=8, sampler="random", storage=url, seed=9), timer=timer)
    seen_first = {tuple(sorted(r.config.items())) for r in first.records}
    assert not seen_first & {tuple(sorted(r.config.items())) for r in second.records}
    assert len(second.entry.trials) == 8


def test_bad_options_are_refused():
    with pytest.raises(TunekitError, match="trials must be >= 1"):
        TuneOptions(trials=0)
    with pytest.raises(TunekitError, match="timeout"):
        TuneOptions(timeout_s=-1)


def test_unknown_sampler_lists_valid_ones(toy):
    with pytest.raises(TunekitError, match=r"Available: \['exhaustive', 'gp', 'model', 'random', 'tpe'\]"):
        tune(toy, PROBLEM, fingerprint(), TuneOptions(sampler="annealing"), timer=PlantedTimer())


def test_a_killed_run_keeps_every_finished_trial(toy, isolated_cache):
    """Checkpoints after each measurement: a crash mid-run loses only the trial in flight; a rerun resumes."""
    from tunekit.store.key import CacheKey
    from tunekit.store.store import Store

    class Crash(Exception):
        pass

    class CrashingTimer(PlantedTimer):
        def __call__(self, fn, config):
            if len(self.calls) == 4:
                raise Crash  # stands in for SIGKILL during the fifth timing
            return super().__call__(fn, config)

    device = fingerprint()
    with Store() as store:
        with pytest.raises(Crash):
            tune(
                toy,
                PROBLEM,
                device,
                TuneOptions(trials=20, sampler="random"),
                timer=CrashingTimer(),
                checkpoint=store.put,
            )
        saved = store.get(CacheKey.make("toy", toy.source_hash, device.key, PROBLEM))
        assert saved is not None and sum(t.status == "ok" for t in saved.trials) == 4
        rerun = tune(
            toy, PROBLEM, device, TuneOptions(trials=3, sampler="random"), timer=PlantedTimer(), previous=saved
        )
        measured_before = {tuple(sorted(t.config.items())) for t in saved.trials}
        assert not measured_before & {tuple(sorted(r.config.items())) for r in rerun.records}


def test_integer_outputs_are_poisoned_and_compared_exactly(toy):
    import torch

    from tunekit.tuning.verify import check_outputs, poison

    idx = torch.empty(5, dtype=torch.int64)
    poison(idx)
    assert bool((idx == torch.iinfo(torch.int64).min).all())
    want = torch.arange(5)
    assert check_outputs(toy, (want.clone(),), (want,)) is None
    assert "1 integer elements differ" in check_outputs(toy, (torch.tensor([0, 1, 2, 3, 5]),), (want,))
