"""No silent detach: every op in tunekit.ops, with every tensor argument requiring grad, either gives torch's
gradients (compared in float64) within the dtype's tolerance, or raises a one-line TunekitError."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import tunekit.ops as ops
from tunekit.core.errors import TunekitError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOLERANCE = {torch.float32: 2e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}  # relative to the largest gradient

_CE_TARGET = torch.tensor([3, -100, 0, 16, 7, 2])  # cross_entropy's class targets, one ignored
# rotary_embedding's cos and sin: fixed (only q and k are leaves: cos or sin requiring grad runs torch's formula, see
# tests/test_rope.py), of q's dtype as transformers casts them, with unequal halves.
_ROPE_GEN = torch.Generator().manual_seed(5)
_COS, _SIN = (torch.rand(2, 5, 8, generator=_ROPE_GEN, dtype=torch.float64) * 2 - 1 for _ in range(2))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


def _rotary(q: torch.Tensor, k: torch.Tensor, rotary: Callable[..., tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """One tensor of both results (the walk compares one output): q [2, 3, 5, 8], k [2, 1, 5, 8] (grouped)."""
    q_embed, k_embed = rotary(q, k, _COS.to(q.dtype), _SIN.to(q.dtype))
    return torch.cat((q_embed.flatten(), k_embed.flatten()))


def _torch_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


# op name -> (shapes of its tensor arguments, tunekit call, torch call); both calls take the tensors in order.
Case = tuple[tuple[tuple[int, ...], ...], Callable[..., torch.Tensor], Callable[..., torch.Tensor]]
CASES: dict[str, Case] = {
    "layer_norm": (
        ((3, 5, 40), (40,), (40,)),
        lambda x, w, b: ops.layer_norm(x, (40,), w, b, 1e-5),
        lambda x, w, b: F.layer_norm(x, (40,), w, b, 1e-5),
    ),
    "rms_norm": (
        ((7, 33), (33,)),
        lambda x, w: ops.rms_norm(x, (33,), w, 1e-6),
        lambda x, w: F.rms_norm(x, (33,), w, 1e-6),
    ),
    "gelu": (((6, 20),), lambda x: ops.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "bias_act": (((4, 3, 24), (24,)), lambda x, b: ops.bias_act(x, b, "silu"), lambda x, b: F.silu(x + b)),
    "bias_act_residual": (
        ((5, 16), (16,), (5, 16)),
        lambda x, b, r: ops.bias_act_residual(x, b, r, "gelu"),
        lambda x, b, r: F.gelu(x + b) + r,
    ),
    "sum": (((6, 9),), lambda x: ops.sum(x, 1), lambda x: torch.sum(x, 1)),
    "mean": (((6, 9),), lambda x: ops.mean(x, 0), lambda x: torch.mean(x, 0)),
    "max": (((6, 9),), lambda x: ops.max(x, 1).values, lambda x: torch.max(x, 1).values),
    "cross_entropy": (
        ((6, 17),),
        lambda x: ops.cross_entropy(x, _CE_TARGET),
        lambda x: F.cross_entropy(x, _CE_TARGET),
    ),
    "softmax": (((6, 17),), lambda x: ops.softmax(x, -1), lambda x: torch.softmax(x, -1)),
    "log_softmax": (((6, 17),), lambda x: ops.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1)),
    "linear": (
        ((2, 5, 24), (16, 24), (16,), (2, 5, 16)),
        lambda x, w, b, r: ops.linear(x, w, b, "gelu_tanh", r),
        lambda x, w, b, r: F.gelu(F.linear(x, w, b), approximate="tanh") + r,
    ),
    "matmul": (
        ((9, 24), (24, 16), (16,), (9, 16)),
        lambda a, b, bias, r: ops.matmul(a, b, bias=bias, activation="relu", alpha=0.5, beta=2.0, residual=r),
        lambda a, b, bias, r: F.relu(0.5 * (a @ b) + bias) + 2.0 * r,
    ),
    "rotary_embedding": (
        ((2, 3, 5, 8), (2, 1, 5, 8)),
        lambda q, k: _rotary(q, k, ops.rotary_embedding),
        lambda q, k: _rotary(q, k, _torch_rotary),
    ),
}


def test_every_op_is_covered():
    assert sorted(CASES) == sorted(ops.__all__)


def _relative_error(got: torch.Tensor | None, want: torch.Tensor) -> float:
    assert got is not None, "a gradient was silently dropped"
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6))


def _check(name: str, dtype: torch.dtype, call_of: Callable[[Case], Callable[..., torch.Tensor]]) -> None:
    case = CASES[name]
    shapes, _, torch_call = case
    gen = torch.Generator().manual_seed(len(name))
    leaves64 = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]
    leaves = [t.detach().to(dtype).requires_grad_() for t in leaves64]
    try:
        out = call_of(case)(*leaves)
    except TunekitError as exc:  # refusing is allowed: with one clear line
        assert "\n" not in str(exc)
        return
    assert out.requires_grad, f"{name} silently detached its output"
    want = torch_call(*leaves64)
    grad_out = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, grad_out.to(dtype), allow_unused=True)
    grads_want = torch.autograd.grad(want, leaves64, grad_out)
    for i, (got, expected) in enumerate(zip(grads, grads_want)):
        error = _relative_error(got, expected)
        assert error <= TOLERANCE[dtype], f"{name} {dtype} argument {i}: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_torch_or_refuse(name, dtype):
    _check(name, dtype, lambda case: case[1])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.usefixtures("swapped_under_compile")
def test_gradients_under_torch_compile_fullgraph(name):
    torch._dynamo.reset()
    _check(name, torch.float32, lambda case: torch.compile(case[1], fullgraph=True, backend="aot_eager"))


# ---- never slower than torch: on a GPU, a problem with no entry of its own runs torch's own op ----


@pytest.fixture
def untuned_gpu(monkeypatch, tmp_path):
    """Dispatch as on a GPU with no tuned entry here (an empty store, a device no shipped database covers)."""
    import dataclasses

    from fingerprints import H200

    from tunekit.runtime import dispatch

    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dispatch, "fingerprint", lambda: dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3"))
    dispatch.reset_all()
    yield dispatch
    dispatch.reset_all()


@pytest.mark.parametrize("name", sorted(CASES))
def test_untuned_problems_run_torch_and_train(name, untuned_gpu):
    _check(name, torch.float32, lambda case: case[1])
    served = {layer for d in untuned_gpu._DISPATCHERS.values() for layer in d.served_by.values()}
    # No kernel of the op has an entry here, so its calls go straight to torch without consulting dispatch.
    assert served <= {"torch"} and getattr(ops, name).stats.torch_direct > 0, served


def test_untuned_triton_setting_serves_the_kernels(untuned_gpu, monkeypatch):
    monkeypatch.setenv("TUNEKIT_UNTUNED", "triton")
    _check("layer_norm", torch.float32, lambda case: case[1])
    assert set(untuned_gpu.dispatcher("layernorm").served_by.values()) <= {"nearest", "heuristic"}


# ---- eager training skips the custom-op dispatcher (its host cost), with the same numbers ----

EAGER_TRAINED = (
    "layer_norm",
    "rms_norm",
    "linear",
    "matmul",
    "gelu",
    "bias_act",
    "bias_act_residual",
    "rotary_embedding",
)


@pytest.mark.parametrize("name", EAGER_TRAINED)
def test_eager_training_takes_the_autograd_function_not_the_custom_op(name, monkeypatch):
    """Eager calls whose gradients flow run the op's eager autograd Function: no tunekit custom op is called,
    forward or backward, and the gradients still match torch's."""
    called: list[str] = []
    real_ops = torch.ops.tunekit

    class Spy:
        def __getattr__(self, attr: str) -> object:
            called.append(attr)
            return getattr(real_ops, attr)

    monkeypatch.setattr(torch.ops, "tunekit", Spy())
    _check(name, torch.float32, lambda case: case[1])
    assert called == [], f"{name} went through torch.ops.tunekit.{called}"


@pytest.mark.parametrize("name", EAGER_TRAINED)
def test_eager_double_backward_raises(name):
    shapes, call, _ = CASES[name]
    leaves = [torch.randn(s).requires_grad_() for s in shapes]
    out = call(*leaves)
    grads = torch.autograd.grad(out.square().sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grads[0].sum().backward()
