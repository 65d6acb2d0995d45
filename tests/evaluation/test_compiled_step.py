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


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_the_verdicts_are_stored_and_the_next_compile_serves_them(monkeypatch) -> None:
    """On a CPU Inductor offers torch's GEMM alone, so its search is stood in for (every problem "won" by a template
    that lowers as torch's GEMM) and the GEMMs are timed on the host: what is checked is the flow: every searched
    problem gets a verdict in its entry, and a kept one is what the next trace takes."""
    torch._dynamo.reset()
    compiled_gemm.forget()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32, bias=False))
    patch(model)
    choice = compiled_gemm.identify("triton::mm", {"BLOCK_M": 16})
    lower = compiled_gemm._lower

    def searched_lower(a: Any, b: Any, asked: str) -> Any:
        if compiled_gemm.searching(asked):
            problem = compiled_gemm._searched_problem(asked)
            assert problem is not None
            compiled_gemm._SEARCHED[problem] = compiled_gemm.Searched(choice, 0.01, 0.02)
            asked = choice
        return lower(a, b, asked)

    monkeypatch.setattr(compiled_gemm, "_lower", searched_lower)
    compiled_gemm._registered.clear()
    spec, device = get_spec("gemm"), fingerprint()
    problems = [make_problem(8, 48, 64, "bfloat16", b_layout="col", has_bias=True),
                make_problem(8, 32, 48, "bfloat16", b_layout="col")]  # fmt: skip
    with Store() as store:
        for p in problems:
            key = CacheKey.make(spec.name, spec.source_hash, device.key, p)
            store.put(Entry(key, dict(spec.heuristic(p, device)), 0.5, device.to_json(), {}))
    model = model.to(torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    always = 0.5  # every step "faster": the guarantee's timer says so, whatever the host's noise
    monkeypatch.setattr(compiled_step, "_group_verdict", _kept_group_verdict)
    with torch.no_grad():
        report = decide_compiled(model, {"decode": lambda m: m(x)}, blocks=1, rounds=1, reps=1,
                                 timer=lambda call, reps: (call(), always)[1])  # fmt: skip
    assert set(report.searched.values()) == {choice} and report.stored == 2
    assert set(report.kept) == {compiled_gemm._canonical(p) for p in problems}
    with Store() as store:
        stored = [store.get(CacheKey.make(spec.name, spec.source_hash, device.key, p)) for p in problems]
    assert all(e is not None and compiled_choice(e) == choice for e in stored)
    assert [compiled_gemm.choice_of(p) for p in problems] == [choice, choice]  # the next trace's
    assert "kept" in report.table()


def _kept_group_verdict(step: str, problems: list[str], choice: str, timed: Any, signature: Any, floor: float):
    """The verdict as decided, then kept (host timings on a CPU decide nothing)."""
    verdict = _group_verdict(step, problems, choice, timed, signature, floor)
    return CompiledVerdict(step, verdict.problems, choice, verdict.ms, verdict.ratio, verdict.noise, True)
