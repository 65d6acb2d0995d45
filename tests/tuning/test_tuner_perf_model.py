"""The `model` strategy inside the real tuner: pruning, seeding, pattern search, shared signatures, warm start.

Candidates are answered by a recorded H200 timing table (tunekit.evaluation.simulate) or by a planted bench: no GPU.
"""

from __future__ import annotations

import pytest
from fingerprints import H200, H200_LIMITS

from tunekit.core.registry import get_spec
from tunekit.core.space import Config, config_id
from tunekit.evaluation.efficiency import describe_table, run_once
from tunekit.evaluation.simulate import simulate_tune
from tunekit.evaluation.timing_table import load_all
from tunekit.kernels import gemm as G
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.tuning import perf_model
from tunekit.tuning.ranker import Ranker, shipped_ranker
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune

SPEC = get_spec("gemm")
RAW = Ranker("gemm")  # no correction: the model's mechanics alone, whatever ranker is shipped


def recorded(kernel: str, **problem: object) -> object:
    for table in load_all():
        if table.kernel == kernel and all(table.problem[k] == v for k, v in problem.items()):
            return table
    raise LookupError(f"no recorded {kernel} table for {problem}")


class PlantedBench:
    """Answers every candidate with a planted time (default 1 ms); remembers the order it was asked in."""

    label = "planted"

    def __init__(self, times: dict | None = None) -> None:
        self.times = times or {}
        self.asked: list[dict] = []

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        self.asked.append(dict(config))
        return TrialRecord(dict(config), "ok", time_ms=self.times.get(config_id(config), 1.0))

    def retime(self, config: Config) -> TrialRecord:
        return TrialRecord(dict(config), "ok", time_ms=self.times.get(config_id(config), 1.0))


def entry_for(problem: dict, config: dict, time_ms: float = 0.5) -> Entry:
    key = CacheKey.make(SPEC.name, SPEC.source_hash, H200.key, problem)
    provenance = {"origin": "local", "strategy": "model"}
    trials = (TrialRecord(dict(config), "ok", time_ms),)
    return Entry(key, dict(config), time_ms, H200.to_json(), provenance, trials)


def test_model_prunes_seeds_and_never_measures_a_pruned_config() -> None:
    table = recorded("gemm", m=4097)
    valid = [r.config for r in table.rows]
    pruning = perf_model.prune("gemm", valid, table.problem, H200_LIMITS)
    assert pruning is not None and pruning.pruned
    pruned = {config_id(c) for c, _ in pruning.pruned}
    sim = simulate_tune(table, "model", 0, max_trials=40, ranker=RAW)
    assert sim.report.model_pruned == len(pruned)
    measured = [r.config for r in sim.report.records]
    heuristic = dict(SPEC.heuristic(table.problem, table.fingerprint))
    assert measured[0] == heuristic
    assert not {config_id(c) for c in measured[1:]} & pruned
    seeds = perf_model.seed_configs("gemm", pruning.kept, table.problem, H200_LIMITS, 8) or []
    expected = [s for s in seeds if s != heuristic]
    assert measured[1 : 1 + len(expected)] == expected  # the seeds come right after the heuristic, in order


def test_pattern_search_moves_one_parameter_at_a_time_from_the_incumbent() -> None:
    """After the seeds, each trial changes one parameter of the fastest config so far (plus the parameters the
    rules pin with it), until every such neighbour the model kept is measured; only then does TPE propose."""
    table = recorded("gemm", m=4097)
    kept = perf_model.prune("gemm", [r.config for r in table.rows], table.problem, H200_LIMITS).kept
    records = simulate_tune(table, "model", 0, max_trials=30, ranker=RAW).report.records

    def one_step(a: dict, b: dict) -> bool:
        return len({k for k in a if a[k] != b[k]} - {"SPLIT_K", "GROUP_M"}) == 1

    n_seeded = 1 + 8  # heuristic and seeds
    pattern_steps = 0
    for i in range(n_seeded, len(records)):
        incumbent = min((r for r in records[:i] if r.status == "ok"), key=lambda r: r.time_ms or 0.0).config
        if one_step(incumbent, records[i].config):
            pattern_steps += 1
            continue
        measured = {config_id(r.config) for r in records[:i]}
        assert all(config_id(c) in measured for c in kept if one_step(incumbent, c))  # neighbourhood exhausted
        break
    assert pattern_steps >= 5


def test_a_fitted_ranker_picks_the_first_config_and_the_heuristic_comes_second() -> None:
    table = recorded("gemm", m=1000)
    ranker = shipped_ranker("gemm")
    assert ranker is not None and ranker.weights
    ranked = perf_model.rank("gemm", [r.config for r in table.rows], table.problem, H200_LIMITS, ranker=ranker)
    assert ranked is not None
    records = simulate_tune(table, "model", 0, max_trials=3, ranker=ranker).report.records
    heuristic = dict(SPEC.heuristic(table.problem, table.fingerprint))
    assert records[0].config == ranked[0].config
    if ranked[0].config != heuristic:
        assert records[1].config == heuristic
    # without a fitted ranker the heuristic is first
    assert simulate_tune(table, "model", 0, max_trials=1, ranker=RAW).report.records[0].config == heuristic


@pytest.mark.parametrize(("table_m", "strategy", "limit"), [(4097, "model", 12), (4096, "model", 12)])
def test_model_reaches_the_recorded_best_quickly(table_m: int, strategy: str, limit: int) -> None:
    table = recorded("gemm", m=table_m)
    run = run_once(table, describe_table(table), strategy, 0)
    assert run.reached and run.trials <= limit


def test_same_quantization_signature_shares_the_entry_without_measuring() -> None:
    tuned_problem = G.make_problem(4096, 4096, 4096, "bfloat16")
    config = dict(SPEC.heuristic(tuned_problem, H200), num_stages=3)
    tuned = [entry_for(tuned_problem, config)]
    # 4081..4096 rows: the same tile count for every BLOCK_M of the space (16..256), the same next power of two.
    twin = G.make_problem(4081, 4096, 4096, "bfloat16")
    bench = PlantedBench()
    report = tune(SPEC, twin, H200, TuneOptions(trials=5), bench=bench, limits=H200_LIMITS, tuned=tuned)
    assert report.stop_reason == "shared" and report.benchmarked == 0 and not bench.asked
    assert (
        report.entry.config == config
        and report.entry.key.problem == CacheKey.make(SPEC.name, SPEC.source_hash, H200.key, twin).problem
    )
    assert report.entry.provenance["origin"] == "shared" and "m=4096" in report.entry.provenance["shared_from"]
    # 4079 rows: 255 tiles of 16 against 256, so it quantizes differently and is tuned.
    other = G.make_problem(4079, 4096, 4096, "bfloat16")
    report = tune(SPEC, other, H200, TuneOptions(trials=3), bench=PlantedBench(), limits=H200_LIMITS, tuned=tuned)
    assert report.stop_reason != "shared" and report.benchmarked == 3


def test_other_strategies_do_not_share_or_prune() -> None:
    tuned_problem = G.make_problem(4096, 4096, 4096, "bfloat16")
    tuned = [entry_for(tuned_problem, dict(SPEC.heuristic(tuned_problem, H200)))]
    twin = G.make_problem(4081, 4096, 4096, "bfloat16")
    options = TuneOptions(trials=2, sampler="tpe")
    report = tune(SPEC, twin, H200, options, bench=PlantedBench(), limits=H200_LIMITS, tuned=tuned)
    assert report.stop_reason != "shared" and report.model_pruned == 0


def test_a_new_shape_warm_starts_from_the_nearest_tuned_one() -> None:
    near = G.make_problem(4096, 4096, 4096, "bfloat16")
    far = G.make_problem(64, 4096, 4096, "bfloat16")
    problem = G.make_problem(3000, 4096, 4096, "bfloat16")
    valid = SPEC.space.valid_configs(problem, H200)
    heuristic = dict(SPEC.heuristic(problem, H200))
    near_config = next(c for c in valid if c != heuristic and c["variant"] == "tma" and c["BLOCK_M"] == 64)
    far_config = next(c for c in valid if c not in (heuristic, near_config))
    tuned = [entry_for(far, far_config), entry_for(near, near_config)]
    bench = PlantedBench()
    tune(SPEC, problem, H200, TuneOptions(trials=3, ranker=RAW), bench=bench, limits=H200_LIMITS, tuned=tuned)
    assert bench.asked[0] == heuristic and bench.asked[1] == near_config
