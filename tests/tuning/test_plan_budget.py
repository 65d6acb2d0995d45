"""`tune --budget`: a plan's problems heaviest first, in two passes: every problem's first configs (the cover), then
the time left spent searching further in proportion to weight (expected work, its roofline floor; per step where
the steps are known), after keeping back what each visit costs past its share (learned as the plan runs); once the
budget is spent, the lightest problems stay untuned and are named."""

from __future__ import annotations

import pytest

from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.kernels.gemm import make_problem
from tunekit.tuning.plan_budget import CLOSE_S, COVER_TRIALS, FIRST_COST_S, PlanBudget, expected_work
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


def test_every_problem_is_covered_largest_first_then_searched_further_in_proportion() -> None:
    now = [0.0]
    budget = PlanBudget(_plan(), 60.0, clock=lambda: now[0])
    weights = [expected_work(s, p) for s, p in budget.order]
    assert weights == sorted(weights, reverse=True)
    assert budget.order[0][1]["m"] == 4096  # the 4096^3 GEMM: by far the most work
    runs = budget.runs(TuneOptions(trials=8))
    covers = []
    for _ in budget.order:
        covers.append(next(runs))
        now[0] += 1.0  # each cover takes 1 s (the time from its yield to the next)
    assert [(s, p) for s, p, _ in covers] == budget.order
    assert all(o.trials == COVER_TRIALS and o.timeout_s is None and o.precompile_threads >= 1 for _, _, o in covers)
    spec, problem, first = next(runs)
    assert (spec, problem) == budget.order[0] and first.trials == 8
    assert budget.cover_cost() == pytest.approx(1.0) and budget.overrun() == pytest.approx(1.0)
    assert first.timeout_s == pytest.approx((57.0 - CLOSE_S) * weights[0] / sum(weights) - 1.0)
    now[0] += first.timeout_s + 2.0  # it used its share and 2 s more: learned as the next visits' overrun
    left = 60.0 - CLOSE_S - now[0]
    spec, problem, second = next(runs)
    assert budget.overrun() == pytest.approx(2.0) and (spec, problem) == budget.order[1]
    assert second.timeout_s == pytest.approx(left * weights[1] / sum(weights[1:]) - 2.0)
    now[0] = 60.0 - CLOSE_S - 1.0  # the last problem's part of the second left is under the overrun: no visit
    assert list(runs) == [] and budget.unreached == []


def test_once_the_budget_is_spent_the_smallest_problems_stay_untuned() -> None:
    now = [0.0]
    budget = PlanBudget(_plan(), 10.0, clock=lambda: now[0])
    runs = budget.runs(TuneOptions(trials=8))
    assert next(runs)[:2] == budget.order[0]
    now[0] = 10.0 - FIRST_COST_S / 2  # the first cover took nearly all of it
    assert list(runs) == []
    assert budget.unreached == budget.order[1:]


@pytest.mark.parametrize("seconds", [20.0, 60.0])
def test_a_plan_ends_near_its_budget(seconds: float) -> None:
    """A fake plan of 40 problems: a cover costs 0.8 s; a deeper search runs to its share (or 3 s, all its trials)
    and costs 0.7 s more (re-timing, torch's timing, the store). The first rule (at least 1 s each, shares by
    expected work from the start) took 40 x 1.7 s here, and left the smallest problems to torch."""
    now = [0.0]
    budget = PlanBudget(_many(40), seconds, clock=lambda: now[0])
    visits: list[int] = []
    for spec, problem, options in budget.runs(TuneOptions(trials=8)):
        deeper = options.timeout_s is not None
        now[0] += min(options.timeout_s, 3.0) + 0.7 if deeper else 0.8
        visits.append(budget.order.index((spec, problem)))
    assert now[0] <= seconds + 0.7  # past the budget by at most one visit's overrun
    covered = [i for n, i in enumerate(visits) if i not in visits[:n]]
    assert covered == list(range(len(covered)))  # covers largest first
    assert budget.unreached == budget.order[len(covered) :]  # the smallest ones, if any
    if seconds >= 40 * 0.8 + 1:
        assert not budget.unreached and len(visits) > 40  # all covered, then the largest searched further
        assert visits[40] == 0
    else:
        assert len(covered) >= 20 and budget.unreached


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


def test_with_steps_known_each_step_weighs_the_same() -> None:
    """A prefill step of large GEMMs and a decode step of 8-token GEMMs: by expected work alone the decode GEMMs
    weigh almost nothing; per step, each step's problems share the same total weight."""
    from tunekit.tuning.plan_budget import step_weights

    gemm = get_spec("gemm")
    prefill = [(gemm, make_problem(4096, n, 4096, "bfloat16", b_layout="col")) for n in (4096, 14336)]
    decode = [(gemm, make_problem(8, n, 4096, "bfloat16", b_layout="col")) for n in (4096, 14336)]
    work = prefill + decode
    steps = [{0, 1}, {2, 3}]
    alone = step_weights(work)
    by_step = step_weights(work, steps)
    assert sum(alone[2:]) < 0.1 * sum(alone[:2])
    assert sum(by_step[:2]) == pytest.approx(1.0) and sum(by_step[2:]) == pytest.approx(1.0)
    assert by_step[3] > by_step[0]  # the larger decode GEMM now outweighs the smaller prefill one
    order = PlanBudget(work, 60.0, steps=steps).order
    assert order.index(decode[1]) < order.index(prefill[0])
    # a problem of no step: weighed in a step of its own kind (here: the whole plan of such problems)
    assert step_weights(work, steps[:1])[2:] == pytest.approx([w / sum(alone[2:]) for w in alone[2:]])


def test_a_budget_counts_from_when_the_caller_began() -> None:
    """The caller's imports and plan reading spend the budget too: the deadline runs from `started`."""
    assert PlanBudget(_plan(), 60.0, clock=lambda: 0.0, started=-5.0).left() == pytest.approx(55.0 - CLOSE_S)
    assert PlanBudget(_plan(), 60.0, clock=lambda: 0.0).left() == pytest.approx(60.0 - CLOSE_S)


def test_tune_plan_under_a_budget_visits_a_problem_twice_and_counts_it_once(toy, tmp_path) -> None:
    """tune_model's path (tunekit.evaluation.plan_tuning.tune_plan): a budget large enough for the cover and more
    tunes each problem in two visits (two configs, then further), counted once; a spent one names the rest."""
    import json

    from tunekit.evaluation.plan_tuning import tune_plan
    from tunekit.runtime.recorder import plan_line
    from tunekit.store.store import Store

    plan = tmp_path / "plan.jsonl"
    problems = [{"rows": 8, "cols": c, "dtype": "float32"} for c in (16, 32)]
    plan.write_text("".join(json.dumps({"kernel": "toy", "problem": p}) + "\n" for p in problems))
    steps = [[plan_line("toy", problems[0])], [plan_line("toy", problems[1])]]
    counts = tune_plan(plan, tmp_path / "cache", trials=4, budget_s=120.0, steps=steps)
    assert (counts.tuned, counts.skipped, counts.failed, counts.unreached) == (2, 0, [], [])
    with Store(tmp_path / "cache") as store:
        assert sorted(len(e.trials) for e in store.entries()) == [4, 4]  # both searched past the cover's two
    spent = tune_plan(plan, tmp_path / "other", trials=4, budget_s=0.01)
    assert spent.tuned == 0 and len(spent.unreached) == 2
