"""tunekit.tune_model: record a model's steps, tune, time before and after in alternation, and demote the entries
that make a step slower. The timer here is a fake that reads which configs dispatch served in the call (CPU timings
mean nothing): a planted entry that "slows" the step must be found by bisection and demoted, one that speeds it up
kept, and a demoted entry is served torch's op from then on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.evaluation.tune_model import ModelTuneReport, tune_model
from tunekit.fleet.plans import read_plan
from tunekit.runtime.dispatch import TORCH, dispatcher, resolve
from tunekit.store.entry import DEMOTED, Entry
from tunekit.store.key import CacheKey
from tunekit.store.store import Store


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 48), torch.nn.SiLU(), torch.nn.Linear(48, 32), torch.nn.Linear(32, 16)
    )


def _plant(planted: dict[str, object]):
    """A stand-in for tuning: stores, for two GEMM problems of the plan, a valid config other than the one served
    before (`planted` gets {"slow": problem, "fast": problem, "configs": {problem key tuple: config}, "before":
    {problem key tuple: the config served before}})."""

    def tune(plan: Path, trials: int, report: ModelTuneReport, budget_s: float | None) -> None:
        device = fingerprint()
        spec = get_spec("gemm")
        gemms = [problem for kernel, problem in read_plan(plan) if kernel == "gemm"]
        chosen = []
        for problem in gemms:
            key = spec.problem_key(problem)
            with Store() as store:
                served = resolve(spec, problem, device, store).config  # what dispatch served it before
            other = next(c for c in spec.space.valid_configs(problem, device) if c != served)
            chosen.append((key, problem, other))
            planted.setdefault("before", {})[key] = served
            if len(chosen) == 2:
                break
        with Store() as store:
            for _, problem, config in chosen:
                ckey = CacheKey.make("gemm", spec.source_hash, device.key, problem)
                store.put(Entry(ckey, dict(config), 0.5, device.to_json(), {"strategy": "planted"}))
        planted.update(slow=chosen[0][0], fast=chosen[1][0], configs={k: c for k, _, c in chosen})
        report.tuned = 2

    return tune


def _planted_timer(planted: dict, slow: float, fast: float, noise: bool = False):
    """A fake step timer (CPU timings mean nothing): 10 ms, plus `slow` ms while the planted slow entry serves and
    `fast` ms while the fast one does (read from the dispatcher's memo after the call), with a little noise."""

    def timer(call, reps: int) -> float:
        call()
        memo = dispatcher("gemm").memo
        ms = 10.0 + (0.01 * (time.perf_counter_ns() % 7) if noise else 0.0)
        for which, extra in (("slow", slow), ("fast", fast)):
            if planted and memo.get(planted[which]) == planted["configs"][planted[which]]:
                ms += extra
        return ms

    return timer


def test_a_planted_entry_that_slows_the_step_is_found_and_served_as_before() -> None:
    model = _model()
    x = torch.randn(24, 32)
    planted: dict = {}

    fake_timer = _planted_timer(planted, slow=3.0, fast=-0.5, noise=True)

    def train(m: torch.nn.Module) -> None:
        m(x).square().mean().backward()

    report = tune_model(
        model, {"train": train}, timer=fake_timer, tune=_plant(planted), rounds=3, reps=1, in_step=False
    )
    assert report.changed >= 2  # the planted two, and in the interpreter the problems they are now nearest to
    assert [d.step for d in report.demoted] == ["train"] and len(report.demoted) == 1
    # Only the slow problem is served as before (in the interpreter, the heuristic's config: its planted entry is
    # gone); the step now runs the fast entry and none of the slow one.
    spec, device = get_spec("gemm"), fingerprint()
    with Store() as store:
        slow = resolve(spec, spec.problem_dict(planted["slow"]), device, store)
        fast = resolve(spec, spec.problem_dict(planted["fast"]), device, store)
    assert slow.config == planted["before"][planted["slow"]] != planted["configs"][planted["slow"]]
    assert fast.layer == "cache" and fast.config == planted["configs"][planted["fast"]]
    (step,) = report.steps
    assert step.vs_before > 1.0  # the fast entry stays: the step beats how it was served before
    assert "served as before gemm" in report.table()


def test_a_step_that_did_not_get_slower_demotes_nothing() -> None:
    model = _model()
    x = torch.randn(24, 32)

    def steady_timer(call, reps: int) -> float:
        call()
        return 10.0

    def infer(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m(x)

    report = tune_model(model, {"prefill": infer}, timer=steady_timer, tune=_plant({}), rounds=2, reps=1, in_step=False)
    assert report.changed >= 2 and report.demoted == []
    # each step's problems as plan lines (a budget weighs them per step): here every problem, all of them the step's
    assert len(report.step_problems["prefill"]) == report.problems > 0
    (step,) = report.steps
    assert step.vs_before == pytest.approx(1.0) and step.vs_eager == pytest.approx(1.0)


def test_a_step_with_an_output_is_compared_with_eager() -> None:
    """An inference step's output after tuning against the eager copy's: the same weights and inputs, so the error
    is the kernels' rounding (the interpreter's GEMMs vs torch's); a training step has no output to compare."""
    model = _model()
    x = torch.randn(24, 32)

    def prefill(m: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return m(x)

    def train(m: torch.nn.Module) -> None:
        m(x).square().mean().backward()

    steps = {"prefill": prefill, "train": train}
    report = tune_model(model, steps, timer=lambda call, reps: (call(), 10.0)[1], tune=_plant({}), rounds=2, reps=1,
                        in_step=False)  # fmt: skip
    (accuracy,) = report.accuracy
    assert accuracy.step == "prefill" and accuracy.rel_err < 1e-4 and accuracy.argmax_agree == 1.0
    assert "prefill output vs eager: relative error" in report.table()


def test_compiled_decides_the_compiled_steps_after_the_eager_ones(monkeypatch) -> None:
    """compiled=True hands the patched model and its steps to the compiled steps' decision (tunekit.evaluation.
    compiled_step, tested on its own), whose report joins tune_model's."""
    from tunekit.evaluation import tune_model as module
    from tunekit.evaluation.compiled_step import CompiledReport

    model = _model()
    x = torch.randn(24, 32)
    seen: list[tuple] = []

    def decide(m: torch.nn.Module, steps: dict, **options: object) -> CompiledReport:
        seen.append((m, list(steps), options["floor"]))
        return CompiledReport(searched={"p": "c"}, kept={"p": "c"}, stored=1)

    monkeypatch.setattr(module, "decide_compiled", decide)
    report = tune_model(model, {"prefill": lambda m: m(x)}, timer=lambda call, reps: (call(), 10.0)[1],
                        tune=_plant({}), rounds=2, reps=1, in_step=False, compiled=True, floor=0.01)  # fmt: skip
    assert seen == [(model, ["prefill"], 0.01)]
    assert report.compiled is not None and "compiled GEMMs: 1 searched, 1 kept (1 stored)" in report.table()
    off = tune_model(_model(), {"prefill": lambda m: m(x)}, timer=lambda call, reps: (call(), 10.0)[1],
                     tune=_plant({}), rounds=2, reps=1, in_step=False)  # fmt: skip
    assert off.compiled is None and len(seen) == 1


def test_each_step_records_its_problems_and_what_it_was_served_before() -> None:
    """Two steps of different token counts: each step's problems are its own, and "before" (what the verification
    serves as before) holds both steps' problems, so tuning the first step's problems counts as a change."""
    model = _model()
    prefill_x, decode_x = torch.randn(24, 32), torch.randn(8, 32)

    def steady_timer(call, reps: int) -> float:
        call()
        return 10.0

    def infer(x: torch.Tensor):
        def step(m: torch.nn.Module) -> None:
            with torch.no_grad():
                m(x)

        return step

    steps = {"prefill": infer(prefill_x), "decode": infer(decode_x)}
    report = tune_model(model, steps, timer=steady_timer, tune=_plant({}), rounds=2, reps=1, in_step=False)
    prefill, decode = (set(report.step_problems[s]) for s in ("prefill", "decode"))
    assert prefill and decode and not prefill & decode and len(prefill | decode) == report.problems
    assert report.changed >= 2  # the two planted GEMMs are the plan's first: the prefill step's


class ScriptedAlternation:
    """Stands in for the alternation: each run returns the next scripted gain of the subset over "after"."""

    def __init__(self, gains: list[float]) -> None:
        self.gains, self.runs = list(gains), 0

    def run(self, calls: dict) -> dict[str, list[float]]:
        self.runs += 1
        gain = self.gains.pop(0)
        return {"after": [10.0 * (1 + gain)] * 3, "subset": [10.0] * 3}


@pytest.mark.parametrize(
    "gains, demoted",
    [
        ([0.05, 0.001], None),  # the second timing sees no gain: noise, kept
        ([0.05, 0.03], 0.03),  # both past the tolerance: demoted, with the smaller gain
        ([0.01], None),  # not past it the first time: not timed again
    ],
)
def test_a_single_suspect_is_demoted_only_when_a_second_timing_agrees(gains, demoted) -> None:
    from tunekit.evaluation.tune_model import _causes

    suspect = ("gemm", ("a problem key",))
    before = {"gemm": {suspect[1]: {"BLOCK_M": 64}}}
    alternate = ScriptedAlternation(gains)
    found = _causes([suspect], before, alternate, lambda: None, tolerance=0.02)  # type: ignore[arg-type]
    assert alternate.runs == len(gains)
    if demoted is None:
        assert found == []
    else:
        ((problem, gain),) = found
        assert problem == suspect and gain == pytest.approx(demoted)


def test_a_slower_step_with_no_single_cause_has_its_changes_served_as_before() -> None:
    """Two planted entries each slow the step by 1.5%, under the bisection's 2% tolerance, 3% together: bisection
    names neither, so the guarantee serves both as before, stored so, and the step is timed again at before's speed."""
    model = _model()
    x = torch.randn(24, 32)
    planted: dict = {}

    fake_timer = _planted_timer(planted, slow=0.15, fast=0.15)  # here both planted entries are slightly slower

    def train(m: torch.nn.Module) -> None:
        m(x).square().mean().backward()

    spec, device = get_spec("gemm"), fingerprint()
    report = tune_model(
        model, {"train": train}, timer=fake_timer, tune=_plant(planted), rounds=3, reps=1, in_step=False
    )
    assert report.demoted == []
    ((undone),) = report.undone
    assert undone.step == "train" and undone.vs_before == pytest.approx(10.0 / 10.3) and undone.problems >= 2
    (step,) = report.steps
    assert step.vs_before == pytest.approx(1.0) and step.as_before  # timed again: the same serving both ways
    assert "undone train" in report.table() and "served as before: a control" in report.table()
    with Store() as store:
        for which in ("slow", "fast"):
            served = resolve(spec, spec.problem_dict(planted[which]), device, store)
            assert served.config == planted["before"][planted[which]] != planted["configs"][planted[which]]


def test_a_step_that_reads_slower_once_is_timed_again_before_its_changes_are_undone() -> None:
    """The whole step's timing is noisy on a GPU: a step that reads 3% slower in one alternation and as fast as
    before in the next keeps its changes, and the second timing is what the report says."""
    model = _model()
    x = torch.randn(24, 32)
    planted: dict = {}
    steady = _planted_timer(planted, slow=0.0, fast=0.0)
    calls = {"n": 0}
    alternation = 3 * 3  # rounds x servings (after, before, eager), one timer call each

    def timer(call, reps: int) -> float:
        calls["n"] += 1
        ms = steady(call, reps)
        memo = dispatcher("gemm").memo
        first_look = alternation < calls["n"] <= 2 * alternation  # bisection's look (1st) reads it fine
        slow_served = memo.get(planted["slow"]) == planted["configs"][planted["slow"]]
        return ms + 0.3 if first_look and slow_served else ms

    def train(m: torch.nn.Module) -> None:
        m(x).square().mean().backward()

    report = tune_model(model, {"train": train}, timer=timer, tune=_plant(planted), rounds=3, reps=1, in_step=False)
    assert report.undone == [] and report.demoted == []
    (step,) = report.steps
    assert step.vs_before == pytest.approx(1.0) and not step.as_before  # the second look, the changes kept
    assert calls["n"] == 3 * alternation


def test_a_step_slower_by_less_than_the_guarantee_is_left_as_tuned() -> None:
    model = _model()
    x = torch.randn(24, 32)
    planted: dict = {}

    fake_timer = _planted_timer(planted, slow=0.05, fast=0.0)  # 0.5% slower: inside the 1% guarantee

    def prefill(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m(x)

    report = tune_model(
        model, {"prefill": prefill}, timer=fake_timer, tune=_plant(planted), rounds=2, reps=1, in_step=False
    )
    assert report.undone == [] and report.demoted == []
    spec, device = get_spec("gemm"), fingerprint()
    with Store() as store:
        served = resolve(spec, spec.problem_dict(planted["slow"]), device, store)
    assert served.config == planted["configs"][planted["slow"]]


def test_a_problem_torch_served_before_is_demoted_and_one_with_an_earlier_entry_gets_it_back() -> None:
    """Serving as before, stored: where torch's op served the problem before, the new entry is demoted (re-tuning
    keeps that); where an earlier working-cache entry served it, that entry is put back, trials and all."""
    from tunekit.evaluation.tune_model import _serve_as_before

    spec, device = get_spec("gemm"), fingerprint()
    problems = [spec.problem_from_shape(shape, "float32") for shape in ((24, 48, 32), (24, 32, 48))]
    torch_before, entry_before = ((("gemm", spec.problem_key(p)), p) for p in problems)
    first_config = next(iter(spec.space.valid_configs(problems[0], device)))
    configs = list(spec.space.valid_configs(problems[1], device))[:2]
    keys = [CacheKey.make("gemm", spec.source_hash, device.key, p) for p in problems]
    earlier = Entry(keys[1], dict(configs[0]), 2.0, device.to_json(), {"strategy": "earlier"})
    with Store() as store:
        store.put(Entry(keys[0], dict(first_config), 1.0, device.to_json(), {"strategy": "tuned now"}))
        store.put(earlier)
        store.put(Entry(keys[1], dict(configs[1]), 1.0, device.to_json(), {"strategy": "tuned now"}))
    before = {"gemm": {torch_before[0][1]: TORCH, entry_before[0][1]: dict(configs[0])}}
    prior = {torch_before[0]: None, entry_before[0]: earlier}
    why = {torch_before[0]: "slower", entry_before[0]: "slower"}
    _serve_as_before([torch_before[0], entry_before[0]], before, prior, why)
    with Store() as store:
        first = resolve(spec, problems[0], device, store)
        second = store.get(keys[1])
    assert first.layer == "demoted" and DEMOTED in first.entry.provenance
    assert second is not None and second.config == dict(configs[0]) and second.provenance == {"strategy": "earlier"}


def test_a_step_served_as_before_is_reported_as_a_control() -> None:
    model = _model()
    x = torch.randn(24, 32)
    planted: dict = {}

    fake_timer = _planted_timer(planted, slow=0.3, fast=0.0)

    def prefill(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m(x)

    report = tune_model(
        model, {"prefill": prefill}, timer=fake_timer, tune=_plant(planted), rounds=2, reps=1, in_step=False
    )
    (step,) = report.steps
    # the slow entry is served as before (a culprit); the fast one stays changed, so this is no control
    assert len(report.demoted) == 1 and not step.as_before
    assert "a control" not in report.table()
