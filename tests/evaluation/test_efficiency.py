"""The tuning-efficiency benchmark on synthetic timing tables (tests/evaluation/test_simulate.py plants them)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fingerprints import H200
from test_simulate import planted_table

from tunekit.core.registry import get_spec
from tunekit.evaluation import efficiency
from tunekit.evaluation.efficiency import Ratio, Result, Stat, format_table, median_of, run_benchmark, worst_of
from tunekit.evaluation.simulate import CandidateCost

RMSNORM = {"rows": 2048, "cols": 8192, "dtype": "bfloat16", "weight": True}
STRATEGIES = ("random", "exhaustive", "tpe")


@pytest.fixture(scope="module")
def tables():
    # layernorm: the heuristic default is the best, so every strategy finds it at trial 1
    layernorm = planted_table(best=get_spec("layernorm").heuristic(planted_table().problem, H200))
    return [layernorm, planted_table("rmsnorm", RMSNORM, wrong=None, failed=2)]


@pytest.fixture(scope="module")
def result(tables, tmp_path_factory):
    out = tmp_path_factory.mktemp("efficiency") / "result.json"
    heard = []
    result = run_benchmark(tables, STRATEGIES, seeds=2, out_path=out, progress=lambda *a: heard.append(a), workers=1)
    result.notes.append(f"written to {out}")
    assert [(done, total) for _, done, total in heard] == [(i, 12) for i in range(1, 13)]
    return result


def test_every_run_reaches_the_best_within_the_space(result, tables):
    assert len(result.runs) == len(tables) * len(STRATEGIES) * 2
    for run in result.runs:
        assert run.reached and 1 <= run.trials <= run.cap
        assert run.fraction == pytest.approx(
            run.trials / next(t.n_configs for t in result.tables if t.name == run.table)
        )
        assert run.stop_reason == "stopped by caller" and run.asks >= run.trials


def test_heuristic_as_best_is_found_at_trial_one(result, tables):
    layernorm = result.tables[0]
    runs = [r for r in result.runs if r.table == layernorm.name]
    assert {r.trials for r in runs} == {1}
    heuristic = tables[0].row(tables[0].best().config)
    cost = CandidateCost()
    expected_s = heuristic.compile_s + cost.verify_s + cost.bench_s(heuristic.time_ms)
    assert all(r.seconds == pytest.approx(expected_s) for r in runs)
    for s in result.shapes:
        if s.table == layernorm.name:
            assert s.trials == Stat(1.0) and s.fraction == Stat(1 / layernorm.n_configs)


def test_aggregates_per_kernel_and_overall(result):
    families = {(a.family, a.strategy) for a in result.aggregates}
    assert families == {(f, s) for f in ("layernorm", "rmsnorm", "all") for s in STRATEGIES}
    every_tpe = result.aggregate("all", "tpe")
    assert every_tpe is not None and every_tpe.shapes == 2
    assert result.aggregate("all", "random").fewer_than_random == Ratio(1.0, shapes=2)
    # the layernorm table's heuristic is its best: only the rmsnorm shape needs a search
    assert result.aggregate("all", "tpe").fewer_than_random_searched.shapes == 1
    assert [t.needs_search for t in result.tables] == [False, True]
    rmsnorm_random = result.aggregate("rmsnorm", "random")
    runs = sorted(r.trials for r in result.runs if r.strategy == "random" and r.table.startswith("rmsnorm"))
    assert rmsnorm_random.trials_median == Stat(sum(runs) / 2)  # two seeds: the mean of the middle two
    # the targets are about the model strategy, which did not run here: nothing to judge (7 for the one device)
    assert [t.holds for t in result.targets] == [None] * 7
    assert all(" on NVIDIA H200: " in t.description for t in result.targets)


def test_blind_random_baseline_is_the_exact_expectation(result, tables):
    for info, table in zip(result.tables, tables):
        near = sum(1 for r in table.ok_rows() if (r.time_ms or 0) <= (1 + efficiency.TOLERANCE) * info.best_ms)
        assert info.near_best_configs == near >= 1
        assert info.blind_random_trials == (info.n_configs + 1) / (near + 1)


def test_json_round_trip(result):
    path = result.notes[-1].removeprefix("written to ")
    with open(path) as f:
        data = json.load(f)
    loaded = Result.from_json(data)
    loaded.notes.append(f"written to {path}")  # added after writing
    assert loaded == result
    assert data["tables"][0]["device"]["name"] == "NVIDIA H200"
    assert data["tables"][0]["timer"] == "cuda-events-median-l2-flushed"
    assert data["settings"]["tolerance"] == efficiency.TOLERANCE


def test_format_table(result):
    text = format_table(result)
    assert "| kernel" in text and "x fewer than random" in text and "first <=10%" in text
    # one device: its rows are the all-devices rows, shown once under its name
    assert "| NVIDIA H200 | rmsnorm " in text and "\n| all " not in text
    assert "Model runs" not in text  # the model strategy did not run
    for strategy in STRATEGIES:
        assert f"| {strategy} " in text
    assert "Targets:" in text and "[unknown]" in text
    assert "12 runs on 2 tables" in text


def test_a_run_cut_off_by_its_cap_is_censored(tables):
    result = run_benchmark(tables[1:], ("gp",), seeds=[0], gp_trial_cap=1, workers=1)
    (run,) = result.runs
    assert not run.reached and run.trials == 1 and run.cap == 1
    aggregate = result.aggregate("rmsnorm", "gp")
    assert aggregate.trials_median == Stat(1.0, censored=True)
    assert "| >1 " in format_table(result)


def test_unusable_tables_are_skipped_with_a_note(tables):
    broken = dataclasses.replace(tables[1], rows=tables[1].rows[:-1])
    result = run_benchmark([broken], ("random",), seeds=1, workers=1)
    assert result.runs == [] and "not simulated" in result.notes[0]


def test_worker_processes_give_the_same_numbers(tables):
    alone = run_benchmark(tables[1:], ("tpe",), seeds=2, workers=1)
    pooled = run_benchmark(tables[1:], ("tpe",), seeds=2, workers=2)
    assert [(r.trials, r.seconds, r.asks) for r in alone.runs] == [(r.trials, r.seconds, r.asks) for r in pooled.runs]


def test_censored_medians_are_lower_bounds():
    exact, cut = Stat(5.0), Stat(100.0, censored=True)
    assert median_of([exact, Stat(7.0), cut]) == Stat(7.0)  # the cut-off run sorts above the median
    assert median_of([exact, cut, Stat(100.0, censored=True)]) == Stat(100.0, censored=True)
    assert median_of([Stat(1.0), Stat(2.0), Stat(3.0), Stat(4.0)]) == Stat(2.5)
    assert worst_of([exact, cut]) == cut and worst_of([exact, Stat(7.0)]) == Stat(7.0)
    assert cut.show("g") == ">100" and exact.show(".1f") == "5.0"


def test_targets_are_judged_for_the_model_strategy(tables):
    result = run_benchmark(tables, ("random", "model"), seeds=1, workers=1)
    gemm_fraction, gemm_trials, gemm_worst, every_shape, blind, fewer, first = result.targets
    assert {gemm_fraction.holds, gemm_trials.holds, gemm_worst.holds} == {None}  # no GEMM table here
    assert every_shape.holds is not None and "%" in every_shape.measured
    assert "over 1 shapes" in fewer.measured and "over all 2" in fewer.measured
    assert "over 2 shapes" in blind.measured and blind.holds is not None
    # layernorm's heuristic (trial 1) is its best, rmsnorm's is far off: 1 of 2 shapes, under the 80% asked
    assert first.holds is False and first.measured == "50% (1/2)"
    assert all(t.description.startswith("model (leave-one-shape-out) on NVIDIA H200: ") for t in result.targets)
