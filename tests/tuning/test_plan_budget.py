"""`tune --budget`: a plan's problems largest first, each given a share of the time left in proportion to its
expected work (its roofline floor), unused time passed on, and at least MIN_SHARE_S each."""

from __future__ import annotations

import pytest

from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.kernels.gemm import make_problem
from tunekit.tuning.plan_budget import MIN_SHARE_S, PlanBudget, expected_work


def _plan():
    gemm, norm = get_spec("gemm"), get_spec("layernorm")
    return [
        (norm, norm.problem_from_shape((2048, 4096), "bfloat16")),
        (gemm, make_problem(4096, 4096, 4096, "bfloat16")),
        (gemm, make_problem(16, 4096, 4096, "bfloat16", b_layout="col")),
    ]


def test_largest_first_and_shares_in_proportion_with_unused_time_passed_on() -> None:
    now = [0.0]
    budget = PlanBudget(_plan(), 60.0, clock=lambda: now[0])
    weights = [expected_work(s, p) for s, p in budget.order]
    assert weights == sorted(weights, reverse=True)
    assert budget.order[0][1]["m"] == 4096  # the 4096^3 GEMM: by far the most work
    first = budget.share(0)
    assert first == pytest.approx(60.0 * weights[0] / sum(weights))
    now[0] = first / 2  # it used half its share: the rest go to the others
    second = budget.share(1)
    assert second == pytest.approx((60.0 - first / 2) * weights[1] / sum(weights[1:]))
    now[0] = 61.0  # past the deadline: every problem is still measured at least once
    assert budget.share(2) == MIN_SHARE_S


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(TunekitError, match="--budget must be a positive number of seconds, but got 0"):
        PlanBudget(_plan(), 0)


def test_on_a_gpu_a_budget_times_with_the_default_method_over_shorter_windows(monkeypatch) -> None:
    from tunekit.core import backend
    from tunekit.tuning import bench

    monkeypatch.setattr(backend, "INTERPRETED", False)
    quick, default = bench.budget_timer(), bench.default_timer()
    assert isinstance(quick, bench.CudaEventTimer) and isinstance(default, bench.CudaEventTimer)
    assert quick.label == default.label and quick.host_check_ms == default.host_check_ms
    assert quick.warmup_ms < default.warmup_ms and quick.rep_ms < default.rep_ms


@pytest.mark.usefixtures("wide_terminal")
def test_tune_with_a_budget_uses_the_budget_timer(toy, monkeypatch) -> None:
    from helpers import cli

    from tunekit.tuning import bench

    class Labelled(bench.WallClockTimer):
        label = "the budget's timer"

    monkeypatch.setattr(bench, "budget_timer", Labelled)
    budgeted = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "2", "--budget", "30")
    plain = cli("tune", "-k", "toy", "-s", "8x16", "--trials", "2")
    assert budgeted.exit_code == 0 and plain.exit_code == 0, budgeted.output + plain.output
    assert "(the budget's timer)" in budgeted.output and "the budget's timer" not in plain.output
