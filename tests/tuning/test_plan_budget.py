"""`tune --budget`: a plan's problems largest first, each given a share of the time left in proportion to its
expected work (its roofline floor), after keeping back what each problem still to come costs past its share (learned
as the plan runs); unused time passed on; the smallest problems left untuned once the budget is spent."""

from __future__ import annotations

import pytest

from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.kernels.gemm import make_problem
from tunekit.tuning.plan_budget import FIRST_OVERRUN_S, PlanBudget, expected_work
from tunekit.tuning.tune_types import TuneOptions


def _plan():
    gemm, norm = get_spec("gemm"), get_spec("layernorm")
    return [
        (norm, norm.problem_from_shape((2048, 4096), "bfloat16")),
        (gemm, make_problem(4096, 4096, 4096, "bfloat16")),
        (gemm, make_problem(16, 4096, 4096, "bfloat16", b_layout="col")),
    ]


def _many(n: int):
    gemm = get_spec("gemm")
    return [(gemm, make_problem(64 * (i + 1), 4096, 4096, "bfloat16")) for i in range(n)]


def test_largest_first_and_shares_in_proportion_after_keeping_back_each_problems_overrun() -> None:
    now = [0.0]
    budget = PlanBudget(_plan(), 60.0, clock=lambda: now[0])
    weights = [expected_work(s, p) for s, p in budget.order]
    assert weights == sorted(weights, reverse=True)
    assert budget.order[0][1]["m"] == 4096  # the 4096^3 GEMM: by far the most work
    first = budget.share(0)
    assert first == pytest.approx((60.0 - 3 * FIRST_OVERRUN_S) * weights[0] / sum(weights))
    now[0] = first / 2  # it used half its share (no overrun learned): the rest go to the others
    budget.finished(0, first / 2)
    assert budget.overrun() == FIRST_OVERRUN_S
    second = budget.share(1)
    assert second == pytest.approx((60.0 - first / 2 - 2 * FIRST_OVERRUN_S) * weights[1] / sum(weights[1:]))


def test_what_a_problem_costs_past_its_share_is_learned_and_kept_back_for_the_rest() -> None:
    now = [0.0]
    budget = PlanBudget(_many(5), 30.0, clock=lambda: now[0])
    first = budget.share(0)
    now[0] = first + 2.0  # its search used its share, and re-timing and torch's timing took 2 s more
    budget.finished(0, first + 2.0)
    assert budget.overrun() == pytest.approx(2.0)
    weights = [expected_work(s, p) for s, p in budget.order]
    left = 30.0 - now[0]
    assert budget.share(1) == pytest.approx((left - 4 * 2.0) * weights[1] / sum(weights[1:]))


def test_once_the_budget_is_spent_the_smallest_problems_stay_untuned() -> None:
    now = [0.0]
    budget = PlanBudget(_plan(), 10.0, clock=lambda: now[0])
    runs = budget.runs(TuneOptions(trials=8))
    spec, problem, options = next(runs)
    assert (spec, problem) == budget.order[0] and 0 < options.timeout_s < 10.0 and options.trials == 8
    now[0] = 10.0 - FIRST_OVERRUN_S / 2  # the first problem took nearly all of it
    assert list(runs) == []
    assert budget.unreached == budget.order[1:]


def test_a_plan_ends_near_its_budget_when_every_problem_costs_more_than_its_share() -> None:
    """A fake plan of 40 problems: each search runs to its share (or 3 s, all its trials), and costs 0.7 s more
    (re-timing, torch's timing, the store). The old rule (at least 1 s each) took 40 x 1.7 s here."""
    now = [0.0]
    budget = PlanBudget(_many(40), 20.0, clock=lambda: now[0])
    tuned = 0
    for _, _, options in budget.runs(TuneOptions(trials=8)):
        now[0] += min(options.timeout_s, 3.0) + 0.7
        tuned += 1
    assert now[0] <= 20.0 + 0.7  # past the budget by at most one problem's overrun
    assert tuned + len(budget.unreached) == 40 and tuned >= 20
    assert budget.unreached == budget.order[tuned:]  # the smallest ones


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


@pytest.mark.usefixtures("wide_terminal")
def test_tune_says_which_problems_a_spent_budget_left_untuned(toy, tmp_path) -> None:
    import json

    from helpers import cli

    plan = tmp_path / "plan.jsonl"
    lines = [{"kernel": "toy", "problem": {"rows": 8, "cols": c, "dtype": "float32"}} for c in (16, 32)]
    plan.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # 10 ms cannot pay for one problem (FIRST_OVERRUN_S): nothing is tuned, and both are named
    result = cli("tune", "--plan", str(plan), "--trials", "2", "--budget", "0.01", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["results"] == [] and len(document["unreached"]) == 2
    said = cli("tune", "--plan", str(plan), "--trials", "2", "--budget", "0.01")
    assert "--budget 0.01 s spent before 2 problem(s)" in said.output and "torch serves them" in said.output
    tuned = cli("tune", "--plan", str(plan), "--trials", "2", "--budget", "60", "--json")
    assert (
        tuned.exit_code == 0
        and len(json.loads(tuned.stdout)["results"]) == 2
        and not json.loads(tuned.stdout)["unreached"]
    )
