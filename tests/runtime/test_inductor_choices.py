"""Inductor's GEMM choices from tunekit's store (tunekit.integrations.inductor_choices): Inductor's mm/addmm inputs
map to the problem tunekit's own op would key, the stored decision picks the offered templates (the tuned tile and
torch's GEMM, torch's GEMM alone, or Inductor's own search), and a split-K config is never offered."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fingerprints import H200

from tunekit.core.registry import get_spec
from tunekit.integrations import inductor_choices
from tunekit.integrations.inductor_choices import gemm_problem_of, inductor_tile_of, tunekit_templates
from tunekit.kernels.gemm.host import layout_of
from tunekit.kernels.gemm.problem import key_of, make_problem
from tunekit.store.entry import TORCH_MS, Entry, demoted
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

SPEC = get_spec("gemm")
M, N, K = 96, 80, 200  # K not a multiple of 64 or 128


def linear_mm(m: int = M, n: int = N, k: int = K, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any, Any]:
    """What Inductor sees for F.linear(x, W) without bias: mm(x, W.t()), as (shapes, strides, dtypes)."""
    x, w = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    return (x.shape, w.t().shape), (x.stride(), w.t().stride()), (dtype, dtype)


def test_a_linear_maps_to_the_problem_tunekits_own_op_keys() -> None:
    shapes, strides, dtypes = linear_mm()
    problem = gemm_problem_of("mm", shapes, strides, dtypes)
    x, w = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
    m, n, k, dtype, a_layout, b_layout, _activation, has_bias, _residual, aligned = key_of(
        (x, w.t(), None, None, "none", 1.0, 0.0)
    )
    assert problem == make_problem(m, n, k, dtype, a_layout=a_layout, b_layout=b_layout)
    assert (problem["b_layout"], layout_of(w.t()), has_bias, aligned) == ("col", "col", False, problem["aligned16"])


def test_addmm_takes_a_bias_vector_and_refuses_a_matrix_addend() -> None:
    shapes, strides, dtypes = linear_mm()
    expanded = gemm_problem_of("addmm", ((M, N), *shapes), ((0, 1), *strides), (*dtypes, torch.bfloat16))
    flat = gemm_problem_of("addmm", ((N,), *shapes), ((1,), *strides), (*dtypes, torch.bfloat16))
    assert expanded == flat and expanded is not None and expanded["has_bias"] is True
    assert gemm_problem_of("addmm", ((M, N), *shapes), ((N, 1), *strides), (*dtypes, torch.bfloat16)) is None


@pytest.mark.parametrize(
    "op, shapes, strides, dtypes",
    [
        ("bmm", ((2, M, K), (2, K, N)), ((M * K, K, 1), (K * N, N, 1)), (torch.bfloat16,) * 2),
        ("mm", ((M, K), (K, N)), ((K, 1), (N, 1)), (torch.bfloat16, torch.float16)),  # mixed dtypes
        ("mm", ((M, K), (K, N)), ((2 * K, 2), (N, 1)), (torch.bfloat16,) * 2),  # strided in both dims
        ("mm", ((M, K), (K, N)), ((K, 1), (N, 1)), (torch.int8,) * 2),
    ],
)
def test_what_tunekit_has_no_problem_for_is_left_to_inductor(op, shapes, strides, dtypes) -> None:
    assert gemm_problem_of(op, shapes, strides, dtypes) is None


def test_the_tile_follows_the_config_and_split_k_has_none() -> None:
    config = {"variant": "grouped", "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4, "SPLIT_K": 1,
              "num_warps": 4, "num_stages": 3}  # fmt: skip
    tile = inductor_tile_of(config, 200)
    assert tile == {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4, "num_warps": 4, "num_stages": 3,
                    "EVEN_K": False}  # fmt: skip
    assert inductor_tile_of(config, 256)["EVEN_K"] is True  # type: ignore[index]
    assert inductor_tile_of({**config, "SPLIT_K": 4}, 256) is None


def entry(problem: dict, time_ms: float, torch_ms: float) -> Entry:
    key = CacheKey.make(SPEC.name, SPEC.source_hash, H200.key, problem)
    return Entry(key, dict(SPEC.heuristic(problem, H200)), time_ms, H200.to_json(), {TORCH_MS: torch_ms})


@pytest.fixture
def problem() -> dict:
    found = gemm_problem_of("mm", *linear_mm(4096, 4000, 4000))
    assert found is not None
    return found


def test_the_stored_decision_picks_the_templates(problem: dict) -> None:
    with Store() as store:
        assert tunekit_templates(problem, store, H200) == ("untuned", None)
        tuned = entry(problem, 0.5, 0.6)
        store.put(tuned)
        decision, tile = tunekit_templates(problem, store, H200)
        assert decision == "tuned" and tile == inductor_tile_of(tuned.config, 4000)
        store.put(entry(problem, 0.5, 0.4))  # torch measured faster
        assert tunekit_templates(problem, store, H200) == ("torch", None)
        store.put(demoted(tuned, "prefill ran 5% faster without it"))
        assert tunekit_templates(problem, store, H200) == ("torch", None)


DECODE = (8, 4096, 4096)  # a decode GEMM: small M, large K, where split-K wins


@pytest.fixture
def decode_problem() -> dict:
    found = gemm_problem_of("mm", *linear_mm(*DECODE))
    assert found is not None
    return found


def split_k_entry(problem: dict, *unsplit_ms: float) -> Entry:
    """An entry whose winner is split-K (Inductor's template has no such option), with trials measured without it."""
    from tunekit.store.entry import TrialRecord

    winner = {**entry(problem, 0.5, 0.6).config, "variant": "splitk", "SPLIT_K": 4}
    unsplit = {**winner, "variant": "grouped", "SPLIT_K": 1}
    trials = [TrialRecord(winner, "ok", 0.5)]
    trials += [TrialRecord({**unsplit, "BLOCK_N": 32 * (i + 1)}, "ok", ms) for i, ms in enumerate(unsplit_ms)]
    trials.append(TrialRecord({**unsplit, "BLOCK_N": 256}, "wrong", 0.1))  # fast, but wrong: never
    return dataclasses.replace(entry(problem, 0.5, 0.6), config=winner, trials=tuple(trials))


def test_a_split_k_winner_is_stood_in_for_by_the_fastest_tile_measured_without_it(decode_problem: dict) -> None:
    with Store() as store:
        store.put(split_k_entry(decode_problem))  # no trial without split-K
        assert tunekit_templates(decode_problem, store, H200) == ("untuned", None)
        found = split_k_entry(decode_problem, 0.7, 0.6, 0.9)
        store.put(found)
        decision, tile = tunekit_templates(decode_problem, store, H200)
    assert decision == "proxy" and tile == inductor_tile_of(found.trials[2].config, DECODE[2])
    assert tile is not None and tile["BLOCK_N"] == 64


class FakeTemplate:
    def __init__(self, uid: str) -> None:
        self.uid = uid


def fake_ktc(template: FakeTemplate, **params: Any) -> Any:
    return SimpleNamespace(
        template=template, params=SimpleNamespace(to_kwargs=lambda: dict(params)), extra_kwargs={}, layout=None,
        inputs=None,
    )  # fmt: skip


def cuda_gemm_inputs(m: int, n: int, k: int) -> Any:
    shapes, strides, dtypes = linear_mm(m, n, k)
    return SimpleNamespace(
        device_type="cuda", shapes_hinted=lambda: shapes, strides_hinted=lambda: strides, dtypes=lambda: dtypes
    )


TEMPLATES = [FakeTemplate("aten::mm"), FakeTemplate("triton::mm"), FakeTemplate("triton::mm_persistent_tma")]
SEARCHED = ["inductor's own search"]


@pytest.fixture
def inductor(monkeypatch) -> Any:
    """Inductor's choices on an H200, its own search stubbed (it would compile and time templates)."""
    pytest.importorskip("torch._inductor.kernel_template_choice")
    from torch._inductor.choices import InductorChoices

    monkeypatch.setattr(inductor_choices, "fingerprint", lambda: H200)
    inductor_choices.route_inductor_choices()
    monkeypatch.setattr(inductor_choices, "inductor_finalize", lambda *a, **k: SEARCHED)
    monkeypatch.setattr(
        InductorChoices, "get_ktc",
        lambda _self, _inputs, template, _op, *_: iter([fake_ktc(template, BLOCK_M=32, EVEN_K=True, ACC_TYPE="fp32")]),
    )  # fmt: skip
    return InductorChoices


def test_routing_again_under_another_wrapper_keeps_one_chain(problem, inductor) -> None:
    """tunekit.runtime.compiled_gemm wraps the same method: routed, wrapped on top, routed again (a second
    `tuned_gemm_choices`), each wrapper must still reach Inductor's own, not call the other in a loop."""
    own = inductor_choices.inductor_finalize
    below = inductor._finalize_template_configs

    def on_top(self: Any, *args: Any, **kwargs: Any) -> Any:
        return below(self, *args, **kwargs)

    inductor._finalize_template_configs = on_top
    try:
        inductor_choices.route_inductor_choices()
        assert inductor._finalize_template_configs is on_top and inductor_choices.inductor_finalize is own
        inputs = cuda_gemm_inputs(4096, 4000, 4000)
        with inductor_choices.tuned_gemm_choices("inductor") as choices_class:
            assert choices_class()._finalize_template_configs({}, inputs, TEMPLATES, "mm") is SEARCHED
    finally:
        inductor._finalize_template_configs = below


@pytest.mark.parametrize("untuned", ["aten", "inductor"])
def test_inductor_is_offered_the_tuned_tile_and_torchs_gemm(problem, untuned, inductor) -> None:
    inputs = cuda_gemm_inputs(4096, 4000, 4000)
    with inductor_choices.tuned_gemm_choices(untuned) as choices_class:
        choices = choices_class()

        def offered() -> Any:
            return choices._finalize_template_configs({}, inputs, TEMPLATES, "mm")

        untuned_offer = offered()
        tuned = entry(problem, 0.5, 0.6)
        choices_class.store().put(tuned)
        tuned_offer = offered()
        choices_class.store().put(entry(problem, 0.5, 0.4))
        torch_offer = offered()
    if untuned == "inductor":
        assert untuned_offer is SEARCHED
    else:
        assert [c.template.uid for c in untuned_offer] == ["aten::mm"]
    assert [c.template.uid for c in tuned_offer] == ["aten::mm", "triton::mm"]
    params = tuned_offer[1].params.to_kwargs()
    assert params == {"ACC_TYPE": "fp32", **inductor_tile_of(tuned.config, 4000)}  # type: ignore[dict-item]
    assert [c.template.uid for c in torch_offer] == ["aten::mm"]
    assert choices_class.decisions == [("mm", d, problem) for d in ("untuned", "tuned", "torch")]
    # compiles with and without it never share code: the class is in the compile's options (its cache key)
    assert choices_class.compile_options == {"max_autotune_gemm": True, "inductor_choices_class": choices_class}
    assert choices_class().uuid() == f"tunekit-gemm-choices-{untuned}"


@pytest.mark.parametrize("untuned", ["aten", "inductor"])
def test_a_split_k_stand_in_joins_torchs_gemm_or_inductors_search(decode_problem, untuned, inductor) -> None:
    inputs = cuda_gemm_inputs(*DECODE)
    with inductor_choices.tuned_gemm_choices(untuned) as choices_class:
        choices_class.store().put(split_k_entry(decode_problem, 0.7, 0.6))
        offer = choices_class()._finalize_template_configs({}, inputs, TEMPLATES, "mm")
    uids = [c if isinstance(c, str) else c.template.uid for c in offer]
    assert uids == ([*SEARCHED, "triton::mm"] if untuned == "inductor" else ["aten::mm", "triton::mm"])
    assert [d for _, d, _ in choices_class.decisions] == ["proxy"]


def test_a_handler_made_before_the_options_narrows_on_another_thread(problem, inductor) -> None:
    """A training step's backward compiles on autograd's device thread, under the compile's options (Inductor
    wraps its inner compile in them) but with the handler that thread made on its first lowering (Inductor's plain
    one, if an earlier compile made it): under tunekit's options that handler narrows too; under any other
    compile's it is Inductor's own."""
    from torch._inductor import config

    earlier = inductor()  # made by an earlier compile, before tunekit's options
    inputs = cuda_gemm_inputs(4096, 4000, 4000)
    offers: list[Any] = []

    choices_class = inductor_choices.gemm_choices_class()

    def backward_lowering() -> None:
        with config.patch(choices_class.compile_options):
            offers.append(earlier._finalize_template_configs({}, inputs, TEMPLATES, "mm"))

    choices_class.store().put(entry(problem, 0.5, 0.6))
    thread = threading.Thread(target=backward_lowering)
    thread.start()
    thread.join()
    choices_class.close()
    assert [c.template.uid for c in offers[0]] == ["aten::mm", "triton::mm"]
    assert choices_class.decisions == [("mm", "tuned", problem)]
    assert earlier._finalize_template_configs({}, inputs, TEMPLATES, "mm") is SEARCHED  # another compile's


NO_COMPILER = shutil.which("c++") is None and shutil.which("g++") is None


@pytest.mark.skipif(NO_COMPILER, reason="Inductor's CPU code needs a C++ compiler")
def test_inductor_consults_it_when_it_lowers_a_linear(monkeypatch) -> None:
    """A real compile (Inductor's CPU code): the handler sees the linear's addmm as the problem tunekit keys, and
    the compiled output equals eager's (on a CPU every GEMM stays torch's: no Triton templates there)."""
    seen: list[Any] = []

    def spy(*args: Any) -> Any:
        seen.append(gemm_problem_of(*args))
        return seen[-1]

    monkeypatch.setattr(inductor_choices, "gemm_problem_of", spy)
    torch._dynamo.reset()
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    no_cache = torch._inductor.config.patch(fx_graph_cache=False)  # (a cached graph is not lowered again)
    with no_cache, inductor_choices.tuned_gemm_choices() as choices:
        out = torch.compile(linear, options=choices.compile_options)(x)
    assert torch.equal(out, linear(x))
    assert make_problem(32, 48, 64, "bfloat16", b_layout="col", has_bias=True) in seen
