"""The simulated device answers from a recorded timing table, and the real tuner runs on it deterministically."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest
from fingerprints import H200

from tunekit.core.registry import get_spec
from tunekit.core.space import Value, config_id
from tunekit.evaluation.simulate import (
    NOT_RECORDED,
    CandidateCost,
    SimulatedClock,
    SimulatedDevice,
    check_table,
    simulate_tune,
)
from tunekit.evaluation.timing_table import TimingRow, TimingTable

LAYERNORM = {"rows": 4096, "cols": 4096, "dtype": "float16", "weight": True, "bias": True}
# An H200's occupancy limits, as tunekit.core.device_limits reads them (what a recorded table carries).
H200_LIMITS = {
    "sm_count": 132,
    "warp_size": 32,
    "max_threads_per_sm": 2048,
    "max_blocks_per_sm": 32,
    "regs_per_sm": 65536,
    "smem_per_sm": 233472,
    "smem_per_block": 232448,
}


def planted_table(
    kernel: str = "layernorm",
    problem: Mapping[str, Value] = LAYERNORM,
    best: Mapping[str, Value] | None = None,
    wrong: int | None = 3,
    failed: int | None = 5,
) -> TimingTable:
    """Every valid config of `kernel` for `problem` on an H200, with planted outcomes.

    Times grow with the distance (in parameters that differ) from `best` (default: the tenth valid config), plus a
    small per-config step so that no two are equal; rows `wrong` and `failed` (indices) are planted as such.
    Compile time is 1 s plus 10 ms per row index: every row's cost is distinct.
    """
    spec = get_spec(kernel)
    valid = spec.space.valid_configs(problem, H200)
    best = dict(best if best is not None else valid[10])
    rows = []
    for i, config in enumerate(valid):
        compile_s = 1.0 + 0.01 * i
        if i == wrong:
            rows.append(
                TimingRow(config, "wrong", compile_s=compile_s, error="output 0: max abs error 3 over tolerance")
            )
        elif i == failed:
            rows.append(TimingRow(config, "failed", compile_s=compile_s, error="OutOfResources: shared memory"))
        else:
            distance = sum(config[k] != v for k, v in best.items())
            rows.append(TimingRow(config, "ok", time_ms=0.5 + distance + 0.001 * i, compile_s=compile_s))
    return TimingTable(
        kernel=kernel,
        source_hash=spec.source_hash,
        problem=dict(problem),
        device=H200.to_json(),
        limits=dict(H200_LIMITS),
        timer="cuda-events-median-l2-flushed",
        recorded="2025-01-01T00:00:00+00:00",
        rows=tuple(rows),
    )


@pytest.fixture(scope="module")
def table() -> TimingTable:
    return planted_table()


def test_device_answers_recorded_outcomes_and_charges_their_cost(table):
    clock = SimulatedClock()
    cost = CandidateCost()
    device = SimulatedDevice(table, clock, cost)
    assert device.label == "simulated:cuda-events-median-l2-flushed"
    best = table.best()
    record = device.measure(best.config, verify_seed=1)
    assert record.status == "ok" and record.time_ms == best.time_ms and record.config == best.config
    assert clock() == pytest.approx(best.compile_s + cost.verify_s + cost.bench_s(best.time_ms))

    wrong, failed = table.rows[3], table.rows[5]
    before = clock()
    assert device.measure(wrong.config, 2).status == "wrong"  # compiled and verified, never timed
    assert clock() - before == pytest.approx(wrong.compile_s + cost.verify_s)
    before = clock()
    assert device.measure(failed.config, 3).status == "failed"  # did not compile
    assert clock() - before == pytest.approx(failed.compile_s)

    before = clock()
    again = device.retime(best.config)
    assert again.time_ms == best.time_ms  # no noise by default
    assert clock() - before == pytest.approx(cost.bench_s(best.time_ms))
    assert device.measure_calls == 3 and device.retime_calls == 1


def test_a_config_the_table_lacks_is_failed_and_costs_nothing(table):
    clock = SimulatedClock()
    device = SimulatedDevice(table, clock)
    stranger = {"variant": "looped", "BLOCK_N": 16, "ROWS": 64, "num_warps": 32, "num_stages": 4}
    assert table.row(stranger) is None
    for record in (device.measure(stranger, 0), device.retime(stranger)):
        assert record.status == "failed" and record.error == NOT_RECORDED
    assert clock() == 0.0


def test_bench_cost_follows_do_bench():
    cost = CandidateCost(verify_s=0.1, warmup_ms=25.0, rep_ms=100.0)
    # a fast kernel: 6 fixed launches, then warm-up and repetitions fill their budgets
    assert cost.bench_s(0.01) == pytest.approx((6 * 0.01 + 25 + 100) / 1e3)
    # a kernel slower than both budgets still runs once for each
    assert cost.bench_s(200.0) == pytest.approx((6 * 200 + 200 + 200) / 1e3)


def test_retime_noise_is_off_by_default_and_seeded(table):
    config = table.best().config

    def retimes(noise: float, seed: int) -> list[float]:
        device = SimulatedDevice(table, SimulatedClock(), retime_noise=noise, noise_seed=seed)
        return [float(device.retime(config).time_ms or 0.0) for _ in range(3)]

    assert set(retimes(0.0, 0)) == {table.best().time_ms}
    noisy = retimes(0.05, 7)
    assert noisy == retimes(0.05, 7) != retimes(0.05, 8)
    assert len(set(noisy)) == 3


def test_real_tuner_exhaustive_finds_planted_best_and_charges_each_config_once(table):
    sim = simulate_tune(table, "exhaustive", seed=0, max_trials=1000)
    report, device = sim.report, sim.device
    assert report.entry.config == table.best().config
    assert report.stop_reason == "space exhausted"
    assert report.benchmarked == len(table.rows) == device.measure_calls
    assert max(device.measured.values()) == 1
    assert device.retime_calls == 3  # the top three confirmed
    spec = get_spec("layernorm")
    assert report.records[0].config == spec.heuristic(LAYERNORM, H200)  # the heuristic default goes first
    cost = CandidateCost()
    charged = sum(
        (r.compile_s or 0.0)
        + (cost.verify_s if r.status != "failed" else 0.0)
        + (cost.bench_s(r.time_ms) if r.time_ms is not None else 0.0)
        for r in table.rows
    )
    top3 = sum(cost.bench_s(r.time_ms or 0.0) for r in table.ok_rows()[:3])
    assert sim.elapsed_s == pytest.approx(charged + top3)
    statuses = {config_id(r.config): r.status for r in report.entry.trials}
    assert statuses[config_id(table.rows[3].config)] == "wrong"
    assert statuses[config_id(table.rows[5].config)] == "failed"


def test_time_budget_on_the_simulated_clock_stops_deterministically(table):
    runs = [simulate_tune(table, "exhaustive", seed=2, max_trials=1000, timeout_s=20.0) for _ in range(2)]
    first, second = runs
    assert first.report.stop_reason == "time budget"
    assert first.report.records == second.report.records
    # the clock crossed 20 s during the last measurement, not before it
    device = SimulatedDevice(table, SimulatedClock())
    spent = []
    for record in first.report.records:
        device.measure(record.config, 0)
        spent.append(device.clock())
    assert spent[-2] < 20.0 <= spent[-1]


def test_same_seed_same_trajectory(table):
    def trajectory(seed: int) -> list:
        sim = simulate_tune(table, "tpe", seed=seed, max_trials=15)
        return [(config_id(r.config), r.status, r.time_ms) for r in sim.report.records] + [sim.elapsed_s]

    assert trajectory(3) == trajectory(3)
    assert trajectory(3) != trajectory(4)


def test_on_trial_can_end_the_simulated_search(table):
    seen = []

    def stop_at_third(record, n):
        seen.append(n)
        return n == 3

    sim = simulate_tune(table, "random", seed=0, max_trials=50, on_trial=stop_at_third)
    assert seen == [1, 2, 3] and sim.report.benchmarked == 3 and sim.report.stop_reason == "stopped by caller"


def test_check_table_accepts_a_matching_table_and_flags_stale_or_mismatched_ones(table):
    assert check_table(table) == []

    stale = dataclasses.replace(table, source_hash="0123456789abcdef")
    (problem,) = check_table(stale)
    assert problem.startswith("warning:") and "0123456789abcdef" in problem

    short = dataclasses.replace(table, rows=table.rows[:-2])
    (problem,) = check_table(short)
    assert (
        problem.startswith("error:") and "75 valid configs, the table 73" in problem and "2 valid ones not" in problem
    )

    # Another problem's table: its configs are not this problem's valid set.
    other = dataclasses.replace(table, problem={**LAYERNORM, "cols": 1024})
    assert any(p.startswith("error:") and "recorded ones no longer valid" in p for p in check_table(other))

    assert check_table(dataclasses.replace(table, kernel="no_such_kernel"))[0].startswith("error:")
