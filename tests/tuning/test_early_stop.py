"""The model's early stop (tunekit.tuning.early_stop): the rule alone, then inside the tuner with a planted bench
whose times follow the model (no GPU)."""

from __future__ import annotations

import pytest
from fingerprints import H200, H200_LIMITS

from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, config_id
from tunekit.store.entry import TrialRecord
from tunekit.tuning import perf_model as model
from tunekit.tuning.early_stop import STOP_REASON, nothing_left_to_gain
from tunekit.tuning.ranker import Ranker
from tunekit.tuning.roofline import arch_for
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune

SPEC = get_spec("gemm")
RAW = Ranker("gemm")  # the model's own times, whatever ranker is shipped
PROBLEM = SPEC.default_problems(H200)[0]


def test_the_rule_stops_only_when_no_config_left_can_beat_the_incumbent_by_more_than_the_noise() -> None:
    measured = [(100.0, 1.0), (120.0, 1.2), (150.0, 1.5)]  # measured exactly as modelled: scale 0.01 ms per unit
    assert nothing_left_to_gain(measured, [102.0, 300.0], noise=0.03)  # at best 1.02 ms: within 3% of 1.0
    assert not nothing_left_to_gain(measured, [95.0, 300.0], noise=0.03)  # at best 0.95 ms: 5% better
    assert nothing_left_to_gain(measured, [95.0], noise=0.06)  # ...which a 6% noise covers
    assert not nothing_left_to_gain(measured[:2], [300.0], noise=0.03)  # fewer than MIN_MEASURED: never
    assert nothing_left_to_gain(measured, [], noise=0.0)  # nothing left at all


def test_a_config_that_beat_its_model_keeps_the_search_going() -> None:
    """One config ran twice as well as modelled: the rest might too, so nothing the model ranks near stops it."""
    measured = [(100.0, 1.0), (120.0, 1.2), (200.0, 1.0)]  # the third: 0.005 ms per unit
    assert not nothing_left_to_gain(measured, [150.0], noise=0.03)  # could be 0.75 ms
    assert nothing_left_to_gain(measured, [250.0], noise=0.03)  # at best 1.25 ms


class ModelledBench:
    """Answers each config with its modelled time (scaled), so the model ranks exactly right."""

    label = "planted"

    def __init__(self, times: dict) -> None:
        self.times = times
        self.asked: list[Config] = []

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        self.asked.append(dict(config))
        return self.retime(config)

    def retime(self, config: Config) -> TrialRecord:
        return TrialRecord(dict(config), "ok", time_ms=self.times.get(config_id(config), 10.0))


def _modelled_times() -> dict:
    valid = SPEC.space.valid_configs(PROBLEM, H200)
    ranked = model.rank("gemm", valid, PROBLEM, H200_LIMITS, arch=arch_for(H200.compute_capability))
    assert ranked
    return {config_id(q.config): q.ranked_clk * 1e-6 for q in ranked if q.launchable}


def test_the_tuner_stops_early_where_the_model_is_right_and_not_by_default() -> None:
    times = _modelled_times()
    options = TuneOptions(trials=20, ranker=RAW, early_stop=0.03)
    stopped = tune(SPEC, PROBLEM, H200, options, bench=ModelledBench(times), limits=H200_LIMITS)
    assert stopped.stop_reason == STOP_REASON
    assert 3 <= stopped.benchmarked < 20
    assert stopped.entry.time_ms == pytest.approx(min(times.values()))  # the model's best was measured and won
    full = tune(SPEC, PROBLEM, H200, TuneOptions(trials=20, ranker=RAW), bench=ModelledBench(times), limits=H200_LIMITS)
    assert full.benchmarked == 20 and full.stop_reason == "trial budget"


def test_early_stop_noise_is_checked() -> None:
    with pytest.raises(TunekitError, match="early stop"):
        TuneOptions(early_stop=1.5)
