"""tunekit.ops.rotary_embedding and the rope / rope_backward kernels (in the interpreter): transformers'
apply_rotary_pos_emb forward and backward against float64, every layout models hand it, torch's formula for what
the kernels cannot take, torch.compile, the hot path, and tuning."""

from __future__ import annotations

import json

import pytest
import torch
from fingerprints import H200, INTERPRETER
from helpers import cli
from kernel_checks import DEV, INTERPRETER_NOISE, assert_heuristic_valid, launch_poisoned
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import tunekit.ops as ops
from tunekit.kernels.rope import rope, rope_backward
from tunekit.launch.plan import Replay
from tunekit.ops import rope as rotary
from tunekit.runtime import dispatch
from tunekit.runtime.dispatch import TORCH, Resolution
from tunekit.tuning.verify import check_outputs

pytestmark = INTERPRETER_NOISE
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Relative to the largest element: the kernel rounds once, the float64 reference never.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _cos_sin(batch: int, seq: int, dim: int, dtype: torch.dtype, seed: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent random cos and sin in [-1, 1] (unequal halves: nothing may assume rotary's structure)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple((torch.rand(batch, seq, dim, generator=gen) * 2 - 1).to(dtype) for _ in range(2))  # type: ignore[return-value]


def _projection(batch: int, seq: int, heads: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """As attention builds q and k: proj(x).view(B, S, H, D).transpose(1, 2), a non-contiguous [B, H, S, D]."""
    return _randn(batch, seq, heads * dim, seed=seed, dtype=dtype).view(batch, seq, heads, dim).transpose(1, 2)


def _assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert got.shape == want.shape and got.dtype == dtype, (what, got.shape, got.dtype)
    got, want = got.detach(), want.detach()
    error = float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-6))
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.2e}"


def _grads64(q, k, cos, sin, unsqueeze_dim, grads):
    leaves = [t.detach().double().requires_grad_() for t in (q, k)]
    outs = apply_rotary_pos_emb(*leaves, cos.double(), sin.double(), unsqueeze_dim)
    return outs, torch.autograd.grad(outs, leaves, [g.double() for g in grads])


def _check(q, k, cos, sin, unsqueeze_dim=1, seed=0):
    """Forward and backward of the op against transformers' formula in float64, on the kernels."""
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    outs = ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim)
    grads = [_randn(*o.shape, seed=seed + i, dtype=o.dtype) for i, o in enumerate(outs)]
    got_grads = torch.autograd.grad(outs, (q, k), grads)
    want, want_grads = _grads64(q, k, cos, sin, unsqueeze_dim, grads)
    for name, got, expected in zip(("q", "k", "dq", "dk"), (*outs, *got_grads), (*want, *want_grads)):
        _assert_close(got, expected, q.dtype, name)
    # both kernels served it (the heuristic, in the interpreter), not torch's formula
    assert dispatch.dispatcher("rope").served_by and dispatch.dispatcher("rope_backward").served_by


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_and_backward_match_float64_with_grouped_heads(dtype):
    q, k = _projection(2, 7, 4, 16, dtype, 1), _projection(2, 7, 2, 16, dtype, 2)
    _check(q, k, *_cos_sin(2, 7, 16, dtype), unsqueeze_dim=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_sequence_major_layout_and_a_batch_broadcast(dtype):
    """[B, S, H, D] with unsqueeze_dim=2 (and -2), cos and sin [1, S, D] shared by the batch."""
    q, k = _randn(3, 5, 4, 24, seed=3, dtype=dtype), _randn(3, 5, 1, 24, seed=4, dtype=dtype)
    cos, sin = _cos_sin(1, 5, 24, dtype)
    _check(q, k, cos, sin, unsqueeze_dim=2)
    _check(q, k, cos, sin, unsqueeze_dim=-2)


def test_contiguous_heads_major_and_a_sliced_head_dim():
    """Contiguous [B, H, S, D]; and GPT-NeoX's partial rotary: q[..., :rotary_dims] of a wider head, in place."""
    q, k = _randn(2, 4, 6, 32, seed=5), _randn(2, 4, 6, 32, seed=6)
    _check(q, k, *_cos_sin(2, 6, 32, torch.float32))
    q_wide, k_wide = _randn(2, 4, 6, 40, seed=7), _randn(2, 4, 6, 40, seed=8)
    _check(q_wide[..., :16], k_wide[..., :16], *_cos_sin(2, 6, 16, torch.float32))


def test_backward_is_the_adjoint_with_unequal_sin_halves():
    """dx = g * cos + R^T(g * sin), R^T(v) = cat(v2, -v1): checked directly on the backward op, sin's halves apart
    (a kernel reusing the forward's rotation with sin's halves unswapped is wrong here)."""
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    sin[..., 4:] = -3.0 * sin[..., :4] + 0.5
    gq, gk = _randn(1, 2, 3, 8, seed=3), _randn(1, 1, 3, 8, seed=4)
    dq, dk = rotary._rotary_backward(gq, gk, cos, sin, 1)
    for g, got in ((gq, dq), (gk, dk)):
        s, c = sin.unsqueeze(1), cos.unsqueeze(1)
        gs = g * s
        want = g * c + torch.cat((gs[..., 4:], -gs[..., :4]), -1)
        torch.testing.assert_close(got, want)
    assert dispatch.dispatcher("rope_backward").served_by  # the kernel, not torch


def test_cos_and_sin_requiring_grad_run_torch_and_their_gradients_flow():
    q, k = _projection(2, 3, 2, 8, torch.float32, 1), _projection(2, 3, 2, 8, torch.float32, 2)
    cos, sin = (t.requires_grad_() for t in _cos_sin(2, 3, 8, torch.float32))
    leaves = (q.detach().requires_grad_(), k.detach().requires_grad_(), cos, sin)
    outs = ops.rotary_embedding(*leaves)
    grads = torch.autograd.grad(sum(o.square().sum() for o in outs), leaves)
    want_leaves = [t.detach().double().requires_grad_() for t in leaves]
    want_outs = apply_rotary_pos_emb(*want_leaves)
    want = torch.autograd.grad(sum(o.square().sum() for o in want_outs), want_leaves)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert not dispatch.dispatcher("rope").served_by  # torch's formula, not the kernel


def _fallback_cases() -> list[tuple[str, tuple, int]]:
    f = torch.float32
    q, k = _randn(2, 3, 4, 8, seed=1), _randn(2, 1, 4, 8, seed=2)
    cos, sin = _cos_sin(2, 4, 8, f)
    odd_q, odd_k = _randn(2, 3, 4, 7, seed=1), _randn(2, 1, 4, 7, seed=2)
    return [
        ("odd head dim", (odd_q, odd_k, *_cos_sin(2, 4, 7, f)), 1),
        ("float64", (q.double(), k.double(), cos.double(), sin.double()), 1),
        ("cos of another dtype", (q, k, cos.half(), sin.half()), 1),
        ("cos broadcast up the batch of q", (q[:1], k[:1], cos, sin), 1),
        ("empty sequence", (q[:, :, :0], k[:, :, :0], cos[:, :0], sin[:, :0]), 1),
        ("3-D q and 2-D cos, unsqueeze_dim 0", (q[0], k[0], cos[0], sin[0]), 0),
        ("unsqueeze_dim 3", (q, k, cos[:, :3, :4], sin[:, :3, :4]), 3),
    ]


@pytest.mark.parametrize(("what", "args", "unsqueeze_dim"), _fallback_cases(), ids=[c[0] for c in _fallback_cases()])
def test_what_the_kernels_cannot_take_runs_torch(what, args, unsqueeze_dim):
    got = ops.rotary_embedding(*args, unsqueeze_dim=unsqueeze_dim)
    want = apply_rotary_pos_emb(*args, unsqueeze_dim=unsqueeze_dim)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w), what
    assert not dispatch.dispatcher("rope").served_by


def test_tensors_off_the_kernels_device_run_torch(monkeypatch):
    """CPU tensors on a GPU machine: the formula in torch, where they are."""
    monkeypatch.setattr(rotary, "_DEVICE_TYPE", "cuda")
    q, k = _randn(2, 3, 4, 8, seed=1), _randn(2, 1, 4, 8, seed=2)
    cos, sin = _cos_sin(2, 4, 8, torch.float32)
    for got, want in zip(ops.rotary_embedding(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(got, want)
    assert not dispatch.dispatcher("rope").served_by


def test_torch_errors_stay_torch_errors():
    q, k = _randn(2, 3, 4, 8, seed=1), _randn(2, 1, 4, 8, seed=2)
    cos, sin = _cos_sin(2, 5, 8, torch.float32)  # a sequence of 5 against 4: torch refuses to broadcast
    with pytest.raises(RuntimeError) as ours:
        ops.rotary_embedding(q, k, cos, sin)
    with pytest.raises(RuntimeError) as theirs:
        apply_rotary_pos_emb(q, k, cos, sin)
    assert str(ours.value) == str(theirs.value)


def test_torch_served_problems_run_transformers_formula(monkeypatch):
    """Where dispatch serves torch (an untuned problem on a GPU), the op's result is the formula's, bit for bit."""
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    q, k = _projection(2, 5, 4, 16, torch.bfloat16, 1), _projection(2, 5, 2, 16, torch.bfloat16, 2)
    cos, sin = _cos_sin(2, 5, 16, torch.bfloat16)
    for got, want in zip(ops.rotary_embedding(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(got, want)
    gq, gk = _randn(2, 4, 5, 16, seed=3), _randn(2, 2, 5, 16, seed=4)
    leaves = [t.detach().float().requires_grad_() for t in (q, k)]
    want = torch.autograd.grad(apply_rotary_pos_emb(*leaves, cos.float(), sin.float()), leaves, (gq, gk))
    for got, expected in zip(rotary._rotary_backward(gq, gk, cos.float(), sin.float(), 1), want):
        torch.testing.assert_close(got, expected)


@pytest.mark.usefixtures("swapped_under_compile")
def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    q, k = _projection(2, 5, 4, 8, torch.float32, 1), _projection(2, 5, 2, 8, torch.float32, 2)
    cos, sin = _cos_sin(2, 5, 8, torch.float32)
    compiled = torch.compile(ops.rotary_embedding, fullgraph=True, backend="aot_eager")
    leaves = [t.detach().requires_grad_() for t in (q, k)]
    outs = compiled(*leaves, cos, sin)
    grads = [_randn(*o.shape, seed=i) for i, o in enumerate(outs)]
    got = torch.autograd.grad(outs, leaves, grads)
    want, want_grads = _grads64(q, k, cos, sin, 1, grads)
    for g, w in zip((*outs, *got), (*want, *want_grads)):
        _assert_close(g, w, torch.float32, "compiled")


def test_the_custom_ops_pass_opcheck():
    q, k = _projection(1, 3, 2, 8, torch.float32, 1), _projection(1, 3, 1, 8, torch.float32, 2)
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    torch.library.opcheck(torch.ops.tunekit.rotary_embedding.default, (q.requires_grad_(), k, cos, sin, 1))
    torch.library.opcheck(torch.ops.tunekit.rotary_embedding_backward.default, (q.detach(), k, cos, sin, 1))


def test_inference_calls_replay_their_plan():
    q, k = _projection(2, 5, 4, 8, torch.float16, 1), _projection(2, 5, 2, 8, torch.float16, 2)
    cos, sin = _cos_sin(2, 5, 8, torch.float16)
    stats = ops.rotary_embedding.stats  # type: ignore[attr-defined]
    before = (stats.watched, stats.plans, stats.replays)
    results = [ops.rotary_embedding(q, k, cos, sin) for _ in range(4)]
    assert (stats.watched, stats.plans, stats.replays) == (before[0] + 1, before[1] + 1, before[2] + 2)
    (plan,) = ops.rotary_embedding.plans.values()  # type: ignore[attr-defined]
    assert isinstance(plan, Replay) and len(plan.fires) == 1  # one launch for q and k
    for result in results[1:]:
        assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(result, results[0]))
    assert results[0][0].stride() == q.stride()  # the output keeps q's layout


def test_double_backward_raises():
    q, k = _projection(1, 3, 2, 8, torch.float32, 1).requires_grad_(), _projection(1, 3, 1, 8, torch.float32, 2)
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    q_embed, _ = ops.rotary_embedding(q, k, cos, sin)
    (grad,) = torch.autograd.grad(q_embed.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


# ---- the kernel family ----


@pytest.mark.parametrize("spec", [rope.SPEC, rope_backward.SPEC], ids=lambda s: s.name)
def test_default_problems_heuristic_and_key(spec):
    for problem in spec.default_problems(INTERPRETER):
        assert_heuristic_valid(spec, problem, INTERPRETER)
        inputs = spec.make_inputs(problem, DEV, 0)
        assert spec.key_of(inputs) == spec.problem_key(problem)
        outputs = launch_poisoned(spec, spec.heuristic(problem, INTERPRETER), inputs)
        assert check_outputs(spec, outputs, spec.reference(inputs)) is None
    for problem in spec.default_problems(H200):
        assert_heuristic_valid(spec, problem, H200)
    # the heuristic on a Llama prefill: whole heads of 16-byte vectors, many heads per program, enough programs
    config = spec.heuristic(rope.rope_problem(4096, 32, 8, 128, "bfloat16"), H200)
    assert config["BLOCK_R"] * config["BLOCK_H"] * 128 >= 2048 and config["num_warps"] >= 4


@pytest.mark.parametrize(
    "config", [{"BLOCK_R": 1, "BLOCK_H": 1}, {"BLOCK_R": 4, "BLOCK_H": 2}, {"BLOCK_R": 2, "BLOCK_H": 8}]
)
@pytest.mark.parametrize("spec", [rope.SPEC, rope_backward.SPEC], ids=lambda s: s.name)
def test_every_tile_writes_every_element(spec, config):
    problem = rope.rope_problem(6, 3, 1, 12, "float32", heads_inner=False)  # ragged rows, heads and half dim
    inputs = spec.make_inputs(problem, DEV, 1)
    outputs = launch_poisoned(spec, {**config, "num_warps": 1, "num_stages": 1}, inputs)
    assert check_outputs(spec, outputs, spec.reference(inputs)) is None


def test_the_int64_offsets_path(monkeypatch):
    monkeypatch.setattr(rope, "INT32_LIMIT", 16)  # every launch now forms offsets past the limit
    problem = rope.rope_problem(8, 2, 2, 8, "float32")
    inputs = rope.SPEC.make_inputs(problem, DEV, 2)
    outputs = launch_poisoned(rope.SPEC, rope.SPEC.heuristic(problem, INTERPRETER), inputs)
    assert check_outputs(rope.SPEC, outputs, rope.SPEC.reference(inputs)) is None


def test_problem_from_shape_and_its_errors():
    from tunekit.core.errors import InvalidShapeError

    assert rope.SPEC.problem_from_shape((4000, 32, 8, 128), "bfloat16") == rope.rope_problem(
        4096, 32, 8, 128, "bfloat16"
    )
    with pytest.raises(InvalidShapeError, match="ROWSxHQxHKxD"):
        rope.SPEC.problem_from_shape((4096, 128), "float16")
    assert rope.SPEC.bytes_moved(rope.rope_problem(4, 2, 1, 8, "float16")) == (2 * 3 + 2) * 4 * 8 * 2


def test_a_quick_tune_through_the_cli():


    for kernel in ("rope", "rope_backward"):
        args = ["tune", "--kernel", kernel, "--shape", "8x2x1x16", "--trials", "3", "--json"]
        result = cli(*args)
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.output)["results"]
        assert row["kernel"] == kernel and row["config"]["BLOCK_R"] >= 1, row
