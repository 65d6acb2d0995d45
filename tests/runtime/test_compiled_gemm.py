"""GEMMs in a torch.compile graph served by the Inductor choice stored with their problem (tunekit.runtime.
compiled_gemm): what a trace takes (the store's choice, an override, nothing under TUNEKIT_COMPILE_OPS), the one
candidate Inductor is offered, the op's gradients, and a real compile on Inductor's CPU code."""

from __future__ import annotations

import shutil
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.integrations.patching import patch
from tunekit.kernels.gemm.problem import make_problem
from tunekit.runtime import compile_policy, compiled_gemm
from tunekit.runtime.compiled_gemm import Override, identify
from tunekit.store.database import read_document, write_document
from tunekit.store.entry import Entry, compiled_choice, merge_entries, with_compiled
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

SPEC = get_spec("gemm")
TILE = identify("triton::mm", {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "ACC_TYPE": "tl.float32"})
TORCHS = identify("aten::mm", {})


def entry(problem: dict, **compiled: Any) -> Entry:
    device = fingerprint()
    key = CacheKey.make(SPEC.name, SPEC.source_hash, device.key, problem)
    plain = Entry(key, dict(SPEC.heuristic(problem, device)), 0.5, device.to_json(), {})
    return with_compiled(plain, compiled) if compiled else plain


@pytest.fixture(autouse=True)
def fresh() -> Any:
    compiled_gemm.forget()
    yield
    compiled_gemm.forget()


PROBLEM = make_problem(8, 48, 64, "bfloat16", b_layout="col", has_bias=True)


def test_a_choice_is_inductors_candidate_as_canonical_json() -> None:
    assert identify("triton::mm", {"b": 2, "a": 1}) == identify("triton::mm", {"a": 1, "b": 2})
    assert identify("triton::mm", {"a": 1, "fn": print}) == identify("triton::mm", {"a": 1})  # scalars only
    assert compiled_gemm.is_torchs(TORCHS) and not compiled_gemm.is_torchs(TILE)
    assert not compiled_gemm.is_torchs("not json") and not compiled_gemm.is_torchs('{"uid": 3, "params": {}}')


def test_a_kept_choice_in_the_store_is_what_a_trace_takes() -> None:
    assert compiled_gemm.choice_of(PROBLEM) == ""  # nothing stored: torch's code
    with Store() as store:
        store.put(entry(PROBLEM, kept="choice", choice=TILE, step="decode", noise=0.01, ms={"choice": 1, "torch": 2}))
    compiled_gemm.forget()
    assert compiled_gemm.choice_of(PROBLEM) == TILE
    with Store() as store:
        store.put(entry(PROBLEM, kept="torch", choice=TILE, step="decode", noise=0.01))
    compiled_gemm.forget()
    assert compiled_gemm.choice_of(PROBLEM) == ""  # measured slower in the step: torch's


def test_this_machines_verdict_overrides_a_packs(monkeypatch) -> None:
    """A verdict measured here (even "torch") stands; an entry here without one leaves the shipped verdict."""
    from tunekit.runtime import compiled_gemm as module

    shipped = entry(PROBLEM, kept="choice", choice=TILE, step="decode")
    monkeypatch.setattr(module, "shipped_entries", lambda: {shipped.key: shipped})
    assert compiled_gemm.choice_of(PROBLEM) == TILE  # nothing here: the pack's
    with Store() as store:
        store.put(entry(PROBLEM))  # tuned here, no verdict: still the pack's
    compiled_gemm.forget()
    assert compiled_gemm.choice_of(PROBLEM) == TILE
    with Store() as store:
        store.put(entry(PROBLEM, kept="torch", choice=TILE, step="decode"))
    compiled_gemm.forget()
    assert compiled_gemm.choice_of(PROBLEM) == ""


def test_torchs_own_gemm_is_never_emitted_as_a_choice() -> None:
    with Override(lambda problem: TORCHS).active():
        assert compiled_gemm.choice_of(PROBLEM) == ""


def test_an_override_replaces_the_store_and_each_has_its_own_epoch(monkeypatch) -> None:
    first, second = Override(lambda problem: TILE), Override(lambda problem: "")
    assert first.epoch != second.epoch and min(first.epoch, second.epoch) > 0
    before = compiled_gemm.EPOCH
    with first.active():
        assert compiled_gemm.choice_of(PROBLEM) == TILE
        with second.active():
            assert compiled_gemm.choice_of(PROBLEM) == ""
        assert first.epoch == compiled_gemm.EPOCH
    assert before == compiled_gemm.EPOCH
    compiled_gemm.forget()  # dispatch's reset: the store is read again, compiled graphs keep theirs
    assert before == compiled_gemm.EPOCH
    compiled_gemm.renew()  # the store's verdicts changed: the store's epoch moves, so compiled graphs retrace
    assert before - 1 == compiled_gemm.EPOCH
    monkeypatch.setattr(compile_policy, "FORCED", frozenset())  # TUNEKIT_COMPILE_OPS=none: nothing at all
    with first.active():
        assert compiled_gemm.choice_of(PROBLEM) == ""


class FakeTemplate:
    def __init__(self, uid: str) -> None:
        self.uid = uid


def ktc(uid: str, **params: Any) -> Any:
    return SimpleNamespace(template=FakeTemplate(uid), params=SimpleNamespace(to_kwargs=lambda: dict(params)))


OFFERED = [
    ktc("aten::mm"),
    ktc("triton::mm", BLOCK_M=16, BLOCK_N=32, num_warps=4, ACC_TYPE="tl.float32"),
    ktc("triton::mm", BLOCK_M=16, BLOCK_N=64, num_warps=4, ACC_TYPE="tl.float32"),
    ktc("decompose_k", k_split=4),
]


def test_inductor_is_offered_the_one_candidate_the_choice_names_else_torchs_gemm() -> None:
    assert compiled_gemm._narrowed(OFFERED, TILE) == [OFFERED[2]]
    other_torch = identify("triton::mm", {"BLOCK_M": 128})  # e.g. stored under another torch: not offered here
    assert compiled_gemm._narrowed(OFFERED, other_torch) == [OFFERED[0]]
    assert compiled_gemm._narrowed(OFFERED, "garbage") == [OFFERED[0]]


def test_a_search_names_its_problem_for_the_lowering() -> None:
    search = compiled_gemm.search_choice()
    assert compiled_gemm.searching(search) and compiled_gemm.searching(compiled_gemm.SEARCH)
    assert not compiled_gemm.searching(TILE)
    named = search + "|" + compiled_gemm.without_bias(PROBLEM)
    assert compiled_gemm._searched_problem(named) == compiled_gemm.without_bias(PROBLEM)
    assert '"has_bias":false' in compiled_gemm.without_bias(PROBLEM)


@pytest.mark.parametrize("a_t, b_t", [(False, False), (False, True), (True, False)])
def test_the_op_is_a_gemm_with_torchs_gradients(a_t: bool, b_t: bool) -> None:
    torch.manual_seed(0)
    a = (torch.randn(12, 8) if not a_t else torch.randn(8, 12).t()).requires_grad_()
    b = (torch.randn(8, 6) if not b_t else torch.randn(6, 8).t()).requires_grad_()
    out = torch.ops.tunekit.inductor_mm(a, b, TILE)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = (a.grad, b.grad)
    a.grad = b.grad = None
    torch.mm(a, b).backward(grad)
    assert torch.equal(out, torch.mm(a, b))
    for mine, torchs, operand in zip(got, (a.grad, b.grad), (a, b)):
        assert torch.allclose(mine, torchs, atol=1e-5)
        assert mine.stride() == operand.stride()  # in its operand's layout


def test_an_entry_keeps_its_compiled_fields_flat_through_a_database_and_a_merge(tmp_path) -> None:
    record = {"kept": "choice", "choice": TILE, "step": "decode", "noise": 0.004, "ms": {"choice": 0.2, "torch": 0.3}}
    e = entry(PROBLEM, **record)
    assert compiled_choice(e) == TILE and e.provenance["compiled_ms_torch"] == 0.3
    path = tmp_path / "db.json"
    write_document(path, [e])
    [back] = read_document(path)
    assert compiled_choice(back) == TILE
    older = entry(PROBLEM, kept="torch", choice=TILE, step="prefill", noise=0.01)
    assert compiled_choice(merge_entries(older, e)) == TILE  # the newer verdict, whole
    assert compiled_choice(merge_entries(e, older)) is None
    assert merge_entries(entry(PROBLEM), e).provenance["compiled_step"] == "decode"


NO_COMPILER = shutil.which("c++") is None and shutil.which("g++") is None


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_a_patched_model_compiles_its_linears_through_the_choices(monkeypatch) -> None:
    """A real compile (Inductor's CPU code, where Inductor offers torch's GEMM only, so every choice lowers as
    it): the linears and their backward GEMMs trace with the problems tunekit's own op keys, the output and
    gradients are eager's, and leaving the override goes back to the graph without choices."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32, bias=False))
    x = torch.randn(8, 64, requires_grad=True)
    want = model(x)
    want.sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    patch(model)
    traced: list[tuple] = []
    lowered: list[str] = []
    lower = compiled_gemm._lower
    monkeypatch.setattr(compiled_gemm, "_lower", lambda a, b, choice: lowered.append(choice) or lower(a, b, choice))
    compiled_gemm._registered.clear()  # (the lowering registers again, with the spy)

    def choose(problem: dict) -> str:
        traced.append(tuple(problem[k] for k in ("m", "n", "k", "a_layout", "b_layout", "has_bias")))
        return TILE

    compiled = torch.compile(model)
    with torch._inductor.config.patch(fx_graph_cache=False), Override(choose).active():
        got = compiled(x)
        got.sum().backward()
    assert torch.allclose(got, want, atol=1e-5)
    for p, g in zip(model.parameters(), want_grads):
        assert torch.allclose(p.grad, g, atol=1e-5)  # type: ignore[arg-type]
    assert (8, 48, 64, "row", "col", True) in traced and (8, 32, 48, "row", "col", False) in traced
    assert (8, 48, 32, "row", "row", False) in traced  # dX of the second linear: dY @ W
    assert (32, 48, 8, "col", "row", False) in traced  # its dW, in W's layout: (dY^T X)
    assert lowered.count(TILE) == len(traced)
    before = len(lowered)
    with torch.no_grad():
        compiled(x)  # the store's choices (none): a graph without the op
    assert len(lowered) == before


def test_show_says_what_a_compiled_graph_runs_for_the_problem() -> None:
    from tunekit.cli.views import compiled_text

    assert compiled_text(entry(PROBLEM)) is None
    kept = compiled_text(entry(PROBLEM, kept="choice", choice=TILE, step="decode", ms={"choice": 0.2, "torch": 0.25}))
    assert kept is not None and kept.startswith("compiled (decode): Inductor's candidate") and "torch 0.2500" in kept
    assert compiled_text(entry(PROBLEM, kept="torch", choice=TILE, step="decode")) == "compiled (decode): torch's GEMM"
    by_step = compiled_text(entry(PROBLEM, kept="choice", choice=TILE, step="decode", by="step"))
    assert by_step is not None and "(kept for the whole step's time)" in by_step


def test_an_under_compile_record_is_flat_so_a_database_reads_it_back(tmp_path) -> None:
    """The kernel's and Inductor's times under compile (tunekit.tuning.inductor_candidate) and a model step's
    verdict go into a database and come back; the nested form an older store holds is still read."""
    from tunekit.store.entry import UNDER_COMPILE, under_compile_record, with_under_compile

    timed = with_under_compile(entry(PROBLEM), {"kernel_ms": 0.1, "inductor_ms": 0.2})
    path = tmp_path / "db.json"
    write_document(path, [timed])
    [back] = read_document(path)
    assert under_compile_record(back.provenance) == {"kernel_ms": 0.1, "inductor_ms": 0.2}
    slower = with_under_compile(back, {**under_compile_record(back.provenance), "model": "slower compiled"})
    assert merge_entries(timed, slower).provenance["under_compile_model"] == "slower compiled"
    assert under_compile_record(merge_entries(slower, entry(PROBLEM)).provenance) == under_compile_record(
        slower.provenance
    )  # kept from the older side where the newer has none
    older = Entry(timed.key, timed.config, 0.5, timed.device, {UNDER_COMPILE: {"kernel_ms": 1.0, "inductor_ms": 2.0}})
    assert under_compile_record(older.provenance) == {"kernel_ms": 1.0, "inductor_ms": 2.0}
    assert compile_policy.beats_inductor(older)
    assert UNDER_COMPILE not in merge_entries(older, timed).provenance  # rewritten flat


def test_without_choices_a_patched_model_traces_compile_alones_graph() -> None:
    """Where no problem has a choice, reading the problems adds nothing to the graph (no views left for Inductor
    to drop, no meta tensors): the graph is the one compile alone traces."""
    import copy

    torch.manual_seed(0)
    alone = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 32, bias=False))
    patched = copy.deepcopy(alone)
    patch(patched)
    x = torch.randn(2, 4, 64)

    def nodes(model: torch.nn.Module) -> list[str]:
        torch._dynamo.reset()
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0
        return [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op.startswith("call")]

    assert nodes(patched) == nodes(alone)
