"""One call of every op in tunekit.ops, next to torch's own: the tensor shapes it takes, tunekit's call and torch's.
tests/ops/test_autograd.py checks that every op has a row (and their gradients); tests/runtime/test_hotpath.py runs
them through the hot path."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import tunekit.ops as ops

_CE_TARGET = torch.tensor([3, -100, 0, 16, 7, 2])  # cross_entropy's class targets, one ignored
# rotary_embedding's cos and sin: fixed (only q and k are leaves: cos or sin requiring grad runs torch's formula, see
# tests/kernels/rope/test_rope.py), of q's dtype as transformers casts them, with unequal halves.
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
    "swiglu": (((4, 3, 24), (4, 3, 24)), lambda g, u: ops.swiglu(g, u), lambda g, u: F.silu(g) * u),
}
