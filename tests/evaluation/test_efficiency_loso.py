"""The efficiency benchmark's model runs are leave-one-shape-out; zero-trial quality; numbers per device."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from fingerprints import gpu
from helpers import cli
from test_efficiency import RMSNORM
from test_simulate import planted_table

from tunekit.core.registry import get_spec
from tunekit.evaluation import efficiency, simulate
from tunekit.evaluation.efficiency import (
    Result,
    Run,
    describe_table,
    first_ratio_of,
    format_table,
    run_benchmark,
    run_once,
)
from tunekit.evaluation.timing_table import TimingTable, save_tables
from tunekit.tuning.ranker import Ranker

H100 = gpu("nvidia", "NVIDIA H100 80GB HBM3", "9.0", 132, 232448, 52428800, "13.0")
LAYERNORM_WIDE = {"rows": 4096, "cols": 8192, "dtype": "float16", "weight": True, "bias": True}


def on_h100(table: TimingTable) -> TimingTable:
    """The same recorded rows, said to come from an H100 (same space: same shared memory per block)."""
    return dataclasses.replace(table, device=H100.to_json())


@pytest.fixture(scope="module")
def tables() -> list[TimingTable]:
    layernorm = planted_table()
    # the same problem on two devices, another layernorm problem, and another kernel
    return [
        layernorm,
        on_h100(layernorm),
        planted_table(problem=LAYERNORM_WIDE),
        planted_table("rmsnorm", RMSNORM, wrong=None, failed=2),
    ]


@pytest.fixture
def fits(monkeypatch) -> list[tuple[str, list[str]]]:
    """Every fit_ranker call as (kernel, names of the tables given); the ranker names what it was fitted on."""
    calls: list[tuple[str, list[str]]] = []

    def fake_fit(kernel: str, given: list[TimingTable]) -> Ranker:
        names = [efficiency.table_name(t) for t in given]
        calls.append((kernel, names))
        return Ranker(kernel, {}, None, tuple(n for n, t in zip(names, given) if t.kernel == kernel))

    monkeypatch.setattr(efficiency, "fit_ranker", fake_fit)
    return calls


@pytest.fixture
def rankers_seen(monkeypatch) -> list[tuple[str, str, Ranker | None]]:
    """(table, strategy, ranker) of every simulated search."""
    seen: list[tuple[str, str, Ranker | None]] = []
    real = efficiency.simulate_tune

    def recording(table, strategy, seed, **kwargs):
        seen.append((efficiency.table_name(table), strategy, kwargs.get("ranker")))
        return real(table, strategy, seed, **kwargs)

    monkeypatch.setattr(efficiency, "simulate_tune", recording)
    return seen


def test_each_model_run_uses_a_ranker_fitted_without_its_table(tables, fits, rankers_seen):
    result = run_benchmark(tables, ("random", "model"), seeds=1, workers=1)
    names = [t.name for t in result.tables]
    assert len(set(names)) == 4  # the same problem on two devices: two tables
    # one fit per table, on every table of another problem, of any device (fit_ranker picks the kernel's): the
    # H200 and H100 tables of one problem are both left out of each other's fit
    twins = [{0, 1}, {0, 1}, {2}, {3}]
    assert fits == [(tables[i].kernel, [n for j, n in enumerate(names) if j not in twins[i]]) for i in range(4)]
    model = {table: ranker for table, strategy, ranker in rankers_seen if strategy == "model"}
    assert set(model) == set(names)
    for table, ranker in model.items():
        assert ranker is not None and table not in ranker.fitted_on
        assert result.settings["model_fitted_on"][table] == list(ranker.fitted_on)
    # the H200 layernorm table is scored with a ranker fitted on the other layernorm problem only
    assert model[names[0]].fitted_on == (names[2],)
    assert model[names[3]].fitted_on == ()  # the only rmsnorm table: nothing else to fit on
    assert {ranker for _, strategy, ranker in rankers_seen if strategy == "random"} == {None}
    assert result.settings["model_fit"] == "leave-one-shape-out"
    assert "Model runs: leave-one-shape-out" in format_table(result)


def test_in_sample_fits_one_ranker_per_kernel_on_every_table(tables, fits, rankers_seen):
    result = run_benchmark(tables, ("model",), seeds=1, workers=1, in_sample=True)
    names = [t.name for t in result.tables]
    assert fits == [("layernorm", names), ("rmsnorm", names)]
    assert {table: ranker.fitted_on for table, _, ranker in rankers_seen} == {
        **{n: tuple(names[:3]) for n in names[:3]},
        names[3]: (names[3],),
    }
    assert result.settings["model_fit"] == "in-sample"
    assert all(t.description.startswith("model (in-sample) on ") for t in result.targets)


def test_the_cli_fits_leave_one_shape_out_unless_in_sample(tables, fits, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    path = tmp_path / "layernorm.json.gz"
    save_tables(path, tables[:3])
    args = ["efficiency", "--tables", str(path), "--strategies", "model", "--seeds", "1", "--workers", "1"]
    held_out = cli(*args)
    assert held_out.exit_code == 0, held_out.output
    assert "Model runs: leave-one-shape-out" in held_out.output
    assert [len(given) for _, given in fits] == [1, 1, 2]  # the twins leave each other out
    fits.clear()
    in_sample = cli(*args, "--in-sample")
    assert in_sample.exit_code == 0, in_sample.output
    assert "Model runs: in-sample" in in_sample.output and "model (in-sample) on NVIDIA H200" in in_sample.output
    assert [len(given) for _, given in fits] == [3]


def test_simulate_tune_hands_the_ranker_to_the_tuner(monkeypatch):
    ranker = Ranker("layernorm", {"waves": 0.5}, None, ("other",))
    given = []
    real = simulate.tune

    def recording(spec, problem, device, options, **kwargs):
        given.append(options.ranker)
        return real(spec, problem, device, options, **kwargs)

    monkeypatch.setattr(simulate, "tune", recording)
    simulate.simulate_tune(planted_table(), "model", 0, max_trials=2, ranker=ranker)
    assert given == [ranker]


def test_first_ratio_is_trial_ones_time_over_the_best(tables):
    table = tables[3]  # rmsnorm: its heuristic default is not its best
    heuristic = get_spec("rmsnorm").heuristic(table.problem, table.fingerprint)
    expected = table.row(heuristic).time_ms / table.best().time_ms
    assert expected > 1.1
    for strategy in ("random", "model"):  # every strategy measures the heuristic default first
        run = run_once(table, describe_table(table), strategy, 0)
        assert run.first_ratio == pytest.approx(expected)
    best_first = planted_table(best=get_spec("layernorm").heuristic(tables[0].problem, tables[0].fingerprint))
    assert run_once(best_first, describe_table(best_first), "random", 0).first_ratio == 1.0


def test_a_first_config_that_did_not_run_has_no_ratio():
    problem = planted_table().problem
    table = planted_table()
    heuristic = get_spec("layernorm").heuristic(problem, table.fingerprint)
    index = next(i for i, r in enumerate(table.rows) if r.config == heuristic)
    broken = planted_table(wrong=index)
    run = run_once(broken, describe_table(broken), "random", 0)
    assert run.trials > 1 and run.first_ratio is None


def test_first_ratio_per_shape_is_the_median_over_seeds():
    def runs(*ratios: float | None) -> list[Run]:
        return [Run("t", "tpe", i, 9, True, 1, 1.0, 0.1, 1, "", 0.0, first_ratio=r) for i, r in enumerate(ratios)]

    assert first_ratio_of(runs(1.5, 1.5, 1.5)) == 1.5  # a deterministic strategy: seed 0's
    assert first_ratio_of(runs(1.0, 3.0, None)) == 3.0  # a config that did not run sorts as infinitely slow
    assert first_ratio_of(runs(1.0, None, None)) is None
    assert first_ratio_of([]) is None


def test_aggregates_and_targets_per_device(tables, fits, tmp_path):
    out = tmp_path / "result.json"
    result = run_benchmark(tables, ("random", "model"), seeds=1, workers=1, out_path=out)
    h200, h100 = (result.aggregate("layernorm", "model", device) for device in ("NVIDIA H200", H100.name))
    assert (h200.shapes, h100.shapes, result.aggregate("layernorm", "model").shapes) == (2, 1, 3)
    assert result.aggregate("rmsnorm", "model", H100.name) is None  # recorded on the H200 only
    every = result.aggregate("all", "model")
    within = [s for s in result.shapes if s.strategy == "model" and s.first_ratio is not None and s.first_ratio <= 1.1]
    assert every.first_within == len(within) / 4
    rmsnorm = next(s for s in result.shapes if s.strategy == "model" and s.kernel == "rmsnorm")
    assert rmsnorm.device == "NVIDIA H200" and rmsnorm.first_ratio > 1.1
    assert not math.isclose(every.first_within, 1.0)
    # every target once per device, on that device's numbers
    assert len(result.targets) == 14
    assert sum(f"on {H100.name}: " in t.description for t in result.targets) == 7
    text = format_table(result)
    assert f"| {H100.name} | layernorm " in text and "| all                   | all " in text
    assert Result.from_json(json.loads(out.read_text())) == result
