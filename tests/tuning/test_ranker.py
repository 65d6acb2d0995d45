"""The learned ranker: its features, its fit (it recovers a planted error of the model), the shipped weights (a refit
of the shipped tables), and the untuned pick dispatch serves from it."""

from __future__ import annotations

import dataclasses
import math

import pytest
from fingerprints import H200, H200_LIMITS, INTERPRETER

from tunekit.core.registry import get_spec
from tunekit.evaluation import ranker_fit
from tunekit.evaluation.timing_table import TimingRow, TimingTable, load_all
from tunekit.kernels.gemm.problem import make_problem
from tunekit.store.shipped_data import shipped_table_files
from tunekit.tuning import perf_model
from tunekit.tuning.ranker import Ranker, features, shipped_ranker, unaligned, usable_ranker
from tunekit.tuning.untuned import model_pick

SPEC = get_spec("gemm")


def test_unaligned_reads_the_gemm_flag_and_a_row_width() -> None:
    assert unaligned(make_problem(777, 1531, 2001, "bfloat16"))
    assert not unaligned(make_problem(4096, 4096, 4096, "bfloat16"))
    assert unaligned({"rows": 64, "cols": 4097, "dtype": "bfloat16"})
    assert not unaligned({"rows": 64, "cols": 4100, "dtype": "float32"})  # 16400 bytes: a multiple of 16


def test_features_name_the_variant_and_log2_of_each_integer_parameter() -> None:
    config = {"variant": "tma", "BLOCK_M": 128, "num_warps": 8, "flag": True}
    model_terms = {"wave_efficiency": 0.5, "padded_waste": 0.1, "programs_per_sm": 2, "roofline_share": 0.25}
    aligned = features(config, make_problem(64, 64, 64, "float16"), **model_terms, tiles={"m": 4})
    assert aligned["variant=tma"] == 1.0 and aligned["log2:BLOCK_M"] == 7.0 and aligned["log2:num_warps"] == 3.0
    assert aligned["log_wave_efficiency"] == pytest.approx(math.log(0.5)) and aligned["log2_tiles:m"] == 2.0
    assert "log2:flag" not in aligned and not any(k.endswith(":unaligned") for k in aligned)
    odd = features(config, make_problem(63, 63, 63, "float16"), **model_terms, tiles={"m": 1})
    assert odd["variant=tma:unaligned"] == 1.0 and odd["log2:BLOCK_M:unaligned"] == 7.0


def planted(problem: dict, error: dict[str, float]) -> TimingTable:
    """Every valid GEMM config timed as the model predicts it (in ms) times exp(sum of error[f] x feature f)."""
    valid = SPEC.space.valid_configs(problem, H200)
    rows = []
    quantized = perf_model.quantize_all("gemm", valid, problem, H200_LIMITS)
    assert quantized is not None
    for q in quantized:
        if not math.isfinite(q.predicted_clk):
            continue
        terms = perf_model.ranker_features(q, problem)
        log_error = sum(weight * terms.get(name, 0.0) for name, weight in error.items())
        rows.append(TimingRow(dict(q.config), "ok", time_ms=q.predicted_clk * 1e-6 * math.exp(log_error)))
    return TimingTable(
        "gemm",
        SPEC.source_hash,
        dict(problem),
        H200.to_json(),
        H200_LIMITS.to_json(),
        "planted",
        "2026-11-24",
        tuple(rows),
    )


PLANTED = {"log2:num_warps": 0.4, "variant=tma": -0.3}


@pytest.fixture(scope="module")
def planted_tables() -> list[TimingTable]:
    shapes = [(4096, 4096, 4096), (2048, 8192, 1024), (8192, 1024, 2048), (1024, 1024, 8192)]
    return [planted(make_problem(m, n, k, "bfloat16", b_layout="col"), PLANTED) for m, n, k in shapes]


def test_the_fit_recovers_a_planted_error_and_leaves_other_kernels_alone(planted_tables, monkeypatch) -> None:
    monkeypatch.setattr(ranker_fit, "LOOP_STEP_GRID", (None,))  # the arch's own step: as the tables were planted
    ranker = ranker_fit.fit_ranker("gemm", planted_tables)
    assert ranker.fitted_on == tuple(sorted(ranker_fit.table_name(t) for t in planted_tables))
    # the planted features are recovered; others stay near zero (only the per-table mean is free)
    assert ranker.weights["log2:num_warps"] == pytest.approx(0.4, abs=0.05)
    assert ranker.weights["variant=tma"] - ranker.weights.get("variant=grouped", 0.0) == pytest.approx(-0.3, abs=0.05)
    assert ranker_fit.fit_ranker("softmax", planted_tables) == Ranker("softmax", {}, None, ())


def test_a_fitted_ranker_ranks_a_held_out_planted_table_by_its_true_times(planted_tables, monkeypatch) -> None:
    monkeypatch.setattr(ranker_fit, "LOOP_STEP_GRID", (None,))
    ranker = ranker_fit.fit_ranker("gemm", planted_tables[1:])
    held = planted_tables[0]
    ranked = perf_model.rank("gemm", [r.config for r in held.rows], held.problem, H200_LIMITS, ranker=ranker)
    raw = perf_model.rank("gemm", [r.config for r in held.rows], held.problem, H200_LIMITS)
    assert ranked is not None and raw is not None
    best = held.best().time_ms or 0.0
    assert (held.row(ranked[0].config).time_ms or 0.0) <= 1.02 * best
    assert (held.row(raw[0].config).time_ms or 0.0) > 1.1 * best  # the uncorrected model misses it


def test_the_shipped_weights_are_a_refit_of_the_shipped_tables() -> None:
    tables = load_all(shipped_table_files())
    for kernel in sorted({t.kernel for t in tables}):
        shipped = shipped_ranker(kernel)
        refit = ranker_fit.fit_ranker(kernel, tables)
        if not refit.weights:
            assert shipped is None
            continue
        assert shipped is not None and shipped.fitted_on == refit.fitted_on
        assert shipped.loop_step_clk == refit.loop_step_clk and shipped.confident == refit.confident
        assert set(shipped.weights) == set(refit.weights)
        for name, weight in refit.weights.items():
            assert shipped.weights[name] == pytest.approx(weight, abs=1e-5), name


def test_the_untuned_pick_is_the_rankers_top_config_on_a_gpu_and_none_in_the_interpreter() -> None:
    problem = make_problem(1000, 3000, 2000, "bfloat16", has_bias=True)
    pick = model_pick(SPEC, problem, H200, H200_LIMITS)
    ranker = shipped_ranker("gemm")
    ranked = perf_model.rank("gemm", SPEC.space.valid_configs(problem, H200), problem, H200_LIMITS, ranker=ranker)
    assert pick is not None and ranked is not None and pick == ranked[0].config
    assert SPEC.space.is_valid(pick, problem, H200)
    assert model_pick(SPEC, problem, INTERPRETER, H200_LIMITS) is None
    pointwise = get_spec("pointwise")  # modelled, but no tables recorded: no shipped ranker
    assert shipped_ranker("pointwise") is None
    assert model_pick(pointwise, pointwise.default_problems(H200)[0], H200, H200_LIMITS) is None


def test_only_a_confident_fitted_ranker_is_used() -> None:
    fitted = Ranker("gemm", {"log2:BLOCK_K": 0.25}, 800.0, ("a",), confident=True)
    assert usable_ranker(fitted) is fitted
    assert usable_ranker(dataclasses.replace(fitted, confident=False)) is None
    assert usable_ranker(Ranker("gemm", {}, None, (), confident=True)) is None
    assert usable_ranker(None) is None


def test_confidence_compares_the_first_pick_with_the_heuristic_leave_one_shape_out(planted_tables, monkeypatch):
    monkeypatch.setattr(ranker_fit, "LOOP_STEP_GRID", (None,))
    # the planted error is learnable: held out, the ranker's pick is near-best; is the heuristic's?
    heuristic_hits = sum(ranker_fit._heuristic_ratio(t) <= 1.1 for t in planted_tables)
    assert ranker_fit.fit_ranker("gemm", planted_tables).confident == (heuristic_hits < len(planted_tables))
    monkeypatch.setattr(ranker_fit, "_heuristic_ratio", lambda table: 1.0)  # a heuristic that is always right
    assert not ranker_fit.fit_ranker("gemm", planted_tables).confident


def test_a_ranker_round_trips_through_json() -> None:
    ranker = Ranker("gemm", {"log2:BLOCK_K": 0.25}, 800.0, ("a", "b"), confident=True)
    assert Ranker.from_json(ranker.to_json()) == ranker
    assert dataclasses.replace(ranker, loop_step_clk=None).to_json()["loop_step_clk"] is None
