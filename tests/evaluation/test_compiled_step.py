"""The GEMM choices of a compiled model decided inside its compiled steps (tunekit.evaluation.compiled_step): each
profiled GEMM launch charged to its problem by the buffers it reads, a group left to torch's GEMM where it cannot
be priced, and the verdicts written into the problems' entries and served by the next compile."""

from __future__ import annotations

import shutil
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.evaluation import compiled_step
from tunekit.evaluation.compiled_step import (
    CompiledVerdict,
    _group_verdict,
    decide_compiled,
    gemm_times,
    launch_signature,
    signature_of,
)
from tunekit.evaluation.in_step import BEFORE, CONTROL, TUNED, TraceEvent
from tunekit.integrations.patching import patch
from tunekit.kernels.gemm.problem import make_problem
from tunekit.runtime import compiled_gemm
from tunekit.store.entry import Entry, compiled_choice
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

GATE = make_problem(8, 18944, 3584, "bfloat16", b_layout="col")  # up / gate: [8, 3584] @ W[18944, 3584]^T
DOWN = make_problem(8, 3584, 18944, "bfloat16", b_layout="col")  # down: the same matrices' shapes, other roles
WANTED = [signature_of(DOWN), signature_of(GATE)]


def test_a_problem_and_torchs_gemm_launch_have_one_signature() -> None:
    assert signature_of(GATE) == ((8, 3584), (3584, 18944))
    assert launch_signature("aten::mm", ((8, 3584), (3584, 18944))) == signature_of(GATE)
    assert launch_signature("aten::addmm", ((18944,), (8, 3584), (3584, 18944))) == signature_of(GATE)
    assert launch_signature("aten::bmm", ((2, 8, 3584), (2, 3584, 18944))) is None
    assert launch_signature("triton_poi_fused_add_0", ((8, 3584), (3584, 18944))) is None


def test_a_template_kernel_is_told_apart_by_its_first_matrix_argument() -> None:
    """A gate projection with its epilogue (the up projection's output) reads an [8, 18944] matrix and a weight of
    [18944, 3584], as the down projection does; its first argument is its A: the [8, 1, 3584] hidden states
    (a prologue's input, leading dims folded)."""
    gate = ((8, 1, 3584), (3584,), (18944, 3584), (8, 18944), (8, 18944))
    down = ((8, 18944), (8, 18944), (3584, 18944), (8, 3584))
    assert launch_signature("triton_tem_fused_mm_mul_silu_0", gate, WANTED) == signature_of(GATE)
    assert launch_signature("triton_tem_fused_inductor_mm_1", down, WANTED) == signature_of(DOWN)
    assert launch_signature("triton_tem_fused_mm_2", ((8, 4096), (4096, 4096)), WANTED) is None


def host(name: str, start: int, end: int, shapes: tuple = (), correlation: int = 0) -> TraceEvent:
    return TraceEvent(name, False, start, end, 1, correlation, shapes=shapes)


def kernel(correlation: int, ns: int) -> TraceEvent:
    return TraceEvent("kernel", True, 10**9, 10**9 + ns, 7, correlation)


def test_each_launch_is_charged_the_kernels_of_its_window() -> None:
    events = [
        host("aten::mm", 100, 200, ((8, 3584), (3584, 18944))),
        host("cudaLaunchKernel", 120, 130, correlation=1),
        host("triton_tem_fused_inductor_mm_1", 300, 400, ((8, 18944), (3584, 18944), (8, 3584))),
        host("cuLaunchKernelEx", 310, 320, correlation=2),
        host("aten::mm", 500, 600, ((8, 3584), (3584, 18944))),
        host("cudaLaunchKernel", 510, 520, correlation=3),
        host("triton_poi_fused_add_2", 700, 800),
        host("cuLaunchKernel", 710, 720, correlation=4),
        host("triton_tem_fused_inductor_mm_1", 900, 1000, ((8, 18944), (3584, 18944), (8, 3584))),
        host("cuLaunchKernelEx", 910, 920, correlation=5),
        kernel(1, 3000),
        kernel(2, 5000),
        kernel(3, 1000),
        kernel(4, 9000),
        kernel(5, 4000),
    ]
    times = gemm_times(events, runs=2, wanted=WANTED)
    assert times.keys() == {signature_of(GATE), signature_of(DOWN)}  # not the pointwise kernel's
    assert times[signature_of(GATE)] == pytest.approx((0.002, 1))  # per run, of 2
    assert times[signature_of(DOWN)] == pytest.approx((0.0045, 1))


def blocks(ms: list[float], count: int = 4) -> list[dict]:
    return [{signature_of(GATE): (m, count)} for m in ms]


def test_a_group_keeps_its_choice_only_past_the_controls_spread() -> None:
    timed = {BEFORE: blocks([1.0, 1.0, 1.0]), TUNED: blocks([0.9, 0.91, 0.9]), CONTROL: blocks([0.9, 0.9, 0.91])}
    kept = _group_verdict("decode", ["p"], "c", timed, signature_of(GATE), floor=0.005)
    assert kept.kept and kept.ratio == pytest.approx(0.9) and kept.ms == {BEFORE: 1.0, TUNED: 0.9}
    close = {BEFORE: blocks([1.0, 1.0, 1.0]), TUNED: blocks([0.997, 0.996, 0.998]), CONTROL: blocks([1.0] * 3)}
    assert not _group_verdict("decode", ["p"], "c", close, signature_of(GATE), floor=0.005).kept


def test_a_group_that_ran_other_gemms_with_its_choice_is_not_priced() -> None:
    timed = {BEFORE: blocks([1.0] * 3), TUNED: blocks([0.5] * 3, count=2), CONTROL: blocks([0.5] * 3, count=2)}
    verdict = _group_verdict("decode", ["p"], "c", timed, signature_of(GATE), floor=0.005)
    assert not verdict.kept and verdict.ms == {} and "not priced" in verdict.why


def test_a_verdict_says_what_it_kept() -> None:
    problem = compiled_gemm._canonical(GATE)
    choice = compiled_gemm.identify("triton::mm", {"BLOCK_M": 16, "BLOCK_N": 64})
    line = CompiledVerdict("decode", (problem,), choice, {BEFORE: 0.2, TUNED: 0.18}, 0.9, 0.01, True).line()
    assert "8x18944x3584 row/col" in line and "triton::mm BLOCK_M=16 BLOCK_N=64" in line and line.endswith("kept")


def test_a_step_whose_output_moves_with_the_choices_keeps_none() -> None:
    torchs, tuned = compiled_gemm.Override(lambda p: ""), compiled_gemm.Override(lambda p: "c")
    logits = torch.randn(4, 50)

    def step_with(shift: float):
        def call() -> Any:  # the step's output under whichever override is active
            moved = tuned.epoch == compiled_gemm.EPOCH
            return SimpleNamespace(logits=logits + (shift if moved else 0.0))

        return call

    assert compiled_step._outputs_differ(step_with(0.0), torchs, tuned) == ""
    assert compiled_step._outputs_differ(step_with(0.001), torchs, tuned) == ""  # rounding
    assert "off torch's" in compiled_step._outputs_differ(step_with(1.0), torchs, tuned)
    assert compiled_step._outputs_differ(lambda: None, torchs, tuned) == ""  # a training step: no output


NO_COMPILER = shutil.which("c++") is None and shutil.which("g++") is None


PROBLEMS = [make_problem(8, 48, 64, "bfloat16", b_layout="col", has_bias=True),
            make_problem(8, 32, 48, "bfloat16", b_layout="col")]  # fmt: skip
CHOICE = compiled_gemm.identify("triton::mm", {"BLOCK_M": 16})


def _decide_on_cpu(monkeypatch, gemm_times_keep: bool, step_ms: Any, entries: bool = True):
    """decide_compiled on a small patched model on the CPU. Inductor offers torch's GEMM alone there, so its search
    is stood in for (every problem "won" by a template that lowers as torch's GEMM); the GEMM times' verdicts are
    decided, then set to `gemm_times_keep` (host timings on a CPU decide nothing), and the whole step is timed by
    `step_ms(choices_active: bool)`."""
    torch._dynamo.reset()
    compiled_gemm.forget()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32, bias=False))
    patch(model)
    lower = compiled_gemm._lower

    def searched_lower(a: Any, b: Any, asked: str) -> Any:
        if compiled_gemm.searching(asked):
            problem = compiled_gemm._searched_problem(asked)
            assert problem is not None
            compiled_gemm._SEARCHED[problem] = compiled_gemm.Searched(CHOICE, 0.01, 0.02)
            asked = CHOICE
        return lower(a, b, asked)

    monkeypatch.setattr(compiled_gemm, "_lower", searched_lower)
    compiled_gemm._registered.clear()
    spec, device = get_spec("gemm"), fingerprint()
    with Store() as store:
        for p in PROBLEMS if entries else ():
            key = CacheKey.make(spec.name, spec.source_hash, device.key, p)
            store.put(Entry(key, dict(spec.heuristic(p, device)), 0.5, device.to_json(), {}))

    def group_verdict(step: str, problems: list[str], choice: str, timed: Any, signature: Any, floor: float):
        verdict = _group_verdict(step, problems, choice, timed, signature, floor)
        return CompiledVerdict(step, verdict.problems, choice, verdict.ms, verdict.ratio, 0.0, gemm_times_keep)

    monkeypatch.setattr(compiled_step, "_group_verdict", group_verdict)
    model = model.to(torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16)

    def timer(call: Any, reps: int) -> float:
        call()
        return step_ms(compiled_gemm.choice_of(PROBLEMS[0]) != "")

    with torch.no_grad():
        return decide_compiled(model, {"decode": lambda m: m(x)}, blocks=1, rounds=3, reps=1, timer=timer)


def _stored_choices() -> list[str | None]:
    spec, device = get_spec("gemm"), fingerprint()
    with Store() as store:
        stored = [store.get(CacheKey.make(spec.name, spec.source_hash, device.key, p)) for p in PROBLEMS]
    return [None if e is None else compiled_choice(e) for e in stored]


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_the_verdicts_are_stored_and_the_next_compile_serves_them(monkeypatch) -> None:
    """What passed on GEMM times, in a step not slower whole, is stored and is what the next trace takes."""
    report = _decide_on_cpu(monkeypatch, gemm_times_keep=True, step_ms=lambda choices: 1.0)
    assert set(report.searched.values()) == {CHOICE} and report.stored == 2
    assert set(report.kept) == {compiled_gemm._canonical(p) for p in PROBLEMS} and not report.by_step
    assert _stored_choices() == [CHOICE, CHOICE]
    assert [compiled_gemm.choice_of(p) for p in PROBLEMS] == [CHOICE, CHOICE]  # the next trace's
    assert "kept" in report.table()


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_a_step_bound_by_the_host_keeps_the_winners_its_whole_time_prefers(monkeypatch) -> None:
    """No GEMM ran faster with its template, yet the step did (a host-bound decode: the templates' launches cost the
    host less): every winner is kept, by the step."""
    report = _decide_on_cpu(monkeypatch, gemm_times_keep=False, step_ms=lambda choices: 0.8 if choices else 1.0)
    assert set(report.kept) == {compiled_gemm._canonical(p) for p in PROBLEMS} == report.by_step
    assert report.whole["decode"].kept == compiled_step.EVERY
    assert report.steps["decode"] == pytest.approx(1.25)
    assert _stored_choices() == [CHOICE, CHOICE]
    assert "every winner kept" in report.table()


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_a_step_no_faster_whole_keeps_torchs_gemms(monkeypatch) -> None:
    """Neither the GEMM times nor the whole step favour the winners: torch's GEMMs stay, and the entries say so."""
    report = _decide_on_cpu(monkeypatch, gemm_times_keep=False, step_ms=lambda choices: 1.0)
    assert report.kept == {} and report.whole["decode"].kept == ""
    assert _stored_choices() == [None, None] and report.stored == 2


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_a_problem_without_an_entry_is_reported_not_stored(monkeypatch) -> None:
    report = _decide_on_cpu(monkeypatch, gemm_times_keep=True, step_ms=lambda choices: 1.0, entries=False)
    assert report.stored == 0 and report.unstored == 2 and "2 without an entry" in report.table()


def test_the_search_records_the_fastest_template_even_where_torchs_gemm_is_faster() -> None:
    """A host-bound step may gain from a template that loses to torch's GEMM alone: the search keeps the fastest
    template, with torch's time beside it; a split-K decomposition (not one launch) is never the winner."""

    class Caller:  # one of Inductor's timed choices (hashable: timings are keyed by them)
        def __init__(self, name: str, uid: str | None, **params: object) -> None:
            self.name = name
            template, kwargs = SimpleNamespace(uid=uid), SimpleNamespace(to_kwargs=lambda: params)
            self.annotations = {} if uid is None else {"ktc": SimpleNamespace(template=template, params=kwargs)}

    caller = Caller
    timings = {
        caller("extern_mm", None): 0.010,
        caller("decompose_k", "decompose_k", k_split=4): 0.011,
        caller("triton_mm_1", "triton::mm", BLOCK_M=16): 0.014,
        caller("triton_mm_2", "triton::mm", BLOCK_M=32): 0.012,
    }
    compiled_gemm._LOWERING.problem = "p"
    try:
        compiled_gemm._save_winner(timings)
    finally:
        compiled_gemm._LOWERING.problem = None
    found = compiled_gemm.searched().pop("p")
    assert found.choice == compiled_gemm.identify("triton::mm", {"BLOCK_M": 32})
    assert found.ms == 0.012 and found.torch_ms == 0.010
