"""tunekit.ops.rotary_embedding: transformers' `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`, fused.

    q_embed = q * cos + rotate_half(q) * sin,    k_embed likewise,    rotate_half(x) = cat(-x2, x1)

with cos and sin unsqueezed at `unsqueeze_dim` and broadcast. The `rope` kernel rotates q and k in one launch
(fp32 math, cos and sin read once per row for all heads); the `rope_backward` kernel computes the exact adjoint
dx = g * cos + R^T(g * sin), R^T(v) = cat(v2, -v1), for both (torch custom op `tunekit::rotary_embedding_backward`).

The kernels take q [B, Hq, S, D] and k [B, Hk, S, D] with unsqueeze_dim=1 (or [B, S, H, D] with 2; negative
dims count as torch's), Hq and Hk may differ, any strides (transposed projections and sliced head dims are
read in place; a strided last dim is copied), cos and sin of shape [B or 1, S or 1, D] with q's dtype, D even.
The results are new tensors in q's and k's layout. Everything else (odd D, float64, mixed dtypes, other
broadcasts, tensors off the kernel's device, empty tensors, cos or sin that require grad) runs transformers'
formula in torch: the same results, the same errors.

The op is a torch custom op (`torch.ops.tunekit.rotary_embedding`) for torch.compile; eager calls skip the
custom-op dispatch (inference: the hot path; training: an autograd Function running the same bodies). Where
dispatch serves torch for the backward problem (by default, a problem untuned on a GPU), eager training runs
torch's formula and autograd, as without tunekit. Double backward is not supported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from tunekit.core import backend
from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES
from tunekit.kernels.rope.rope import apply_rotary, rotate_half
from tunekit.kernels.rope.rope_backward import rotate_half_adjoint
from tunekit.ops._checks import grads_flow
from tunekit.ops._launch import dispatch_launch, torch_trains_it
from tunekit.ops.declaration import Autograd, OpDeclaration, Screen, declare, public_op
from tunekit.runtime.dispatch import dispatcher

_ROPE = dispatcher("rope")
_ROPE_BACKWARD = dispatcher("rope_backward")
_DEVICE_TYPE = backend.torch_device().type

Views = tuple[Tensor, Tensor, Tensor, Tensor]


def _heads_dim(unsqueeze_dim: object) -> int | None:
    """Where the heads are: unsqueeze_dim as a non-negative dim of the 4-D result (1 or 2), else None."""
    if type(unsqueeze_dim) is not int:
        return None
    dim = unsqueeze_dim + 4 if unsqueeze_dim < 0 else unsqueeze_dim
    return dim if dim in (1, 2) else None


def _as_rows(t: Tensor, heads_dim: int) -> Tensor:
    """A [B, H, S, D] (heads_dim 1) or [B, S, H, D] tensor as the kernel's [B, S, H, D] view."""
    return t.transpose(1, 2) if heads_dim == 1 else t


def _unit_last(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _same_kind(tensors: tuple[object, ...]) -> bool:
    """Tensors of one kernel dtype, all on one device of the kernel's type."""
    found = [t for t in tensors if isinstance(t, Tensor)]
    if len(found) != len(tensors):
        return False
    first = found[0]
    if first.dtype not in DTYPE_NAMES or first.device.type != _DEVICE_TYPE:
        return False
    return all(t.dtype == first.dtype and t.device == first.device for t in found)


def kernel_views(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: object) -> Views | None:
    """The kernels' inputs (q, k as [B, S, H, D] views; cos, sin as [B, S, D] views), or None where the kernels
    cannot compute what transformers' formula does (then the caller runs the formula)."""
    heads_dim = _heads_dim(unsqueeze_dim)
    if heads_dim is None or not _same_kind((q, k, cos, sin)):
        return None
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return None
    qv, kv = _as_rows(q, heads_dim), _as_rows(k, heads_dim)
    batch, seq, _, dim = qv.shape
    if tuple(kv.shape[:2]) != (batch, seq) or kv.shape[3] != dim or dim % 2 or qv.numel() == 0 or kv.numel() == 0:
        return None
    if cos.shape[0] not in (1, batch) or cos.shape[1] not in (1, seq) or cos.shape[2] != dim:
        return None  # torch would broadcast q or k up to cos (or raise): its formula decides
    c, s = cos.expand(batch, seq, dim), sin.expand(batch, seq, dim)
    if c.stride() != s.stride() or c.stride(-1) != 1:  # the kernel reads both with one set of strides
        c, s = c.contiguous(), s.contiguous()
    return _unit_last(qv), _unit_last(kv), c, s


def _torch_rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """transformers' apply_rotary_pos_emb: what a user runs without tunekit."""
    return apply_rotary(q, k, cos, sin, unsqueeze_dim)


def _torch_into(
    outputs: tuple[Tensor, Tensor], inputs: tuple[Tensor, Tensor], cos: Tensor, sin: Tensor, adjoint: bool
) -> tuple[Tensor, Tensor]:
    """The formula (or its adjoint) in torch ops, its last add written into the outputs (the custom ops' results
    keep the layout their fakes give)."""
    for out, x in zip(outputs, inputs):
        if adjoint:
            torch.add(x * cos, rotate_half_adjoint(x * sin), out=out)
        else:
            torch.add(x * cos, rotate_half(x) * sin, out=out)
    return outputs


def _checked_views(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Views, int]:
    views = kernel_views(q, k, cos, sin, unsqueeze_dim)
    heads_dim = _heads_dim(unsqueeze_dim)
    if views is None or heads_dim is None:
        raise InvalidInputError(
            "tunekit::rotary_embedding takes only what its kernel takes; call tunekit.ops.rotary_embedding, which "
            "runs torch's formula for the rest"
        )
    return views, heads_dim


def _output_like(t: Tensor) -> Tensor:
    """A new tensor in t's layout (empty_like keeps a dense input's strides), row-major where that layout's last
    dim is not unit-stride (a permuted or overlapping input): the kernel writes each head's D elements as one
    contiguous run."""
    out = torch.empty_like(t)
    return out if out.stride(-1) == 1 or out.shape[-1] <= 1 else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _run(
    kernel: Any, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, adjoint: bool
) -> tuple[Tensor, Tensor]:
    """The forward (or backward, on the gradients) kernel into new tensors in q's and k's layout; torch's formula
    where dispatch serves torch."""
    views, heads_dim = _checked_views(q, k, cos, sin, unsqueeze_dim)
    outputs = (_output_like(q), _output_like(k))
    if dispatch_launch(kernel, views, (_as_rows(outputs[0], heads_dim), _as_rows(outputs[1], heads_dim))):
        return outputs
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return _torch_into(outputs, (q, k), c, s, adjoint)


def _rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return _run(_ROPE, q, k, cos, sin, unsqueeze_dim, adjoint=False)


def _rotary_backward(
    grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
) -> tuple[Tensor, Tensor]:
    """(d q, d k): the adjoint of the rotation applied to the incoming gradients."""
    return _run(_ROPE_BACKWARD, grad_q, grad_k, cos, sin, unsqueeze_dim, adjoint=True)


def _like_inputs(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    """Both ops' fake: new tensors in the layout of the first two arguments."""
    _checked_views(q, k, cos, sin, unsqueeze_dim)
    return _output_like(q), _output_like(k)


def _rotary_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, _, cos, sin, unsqueeze_dim = inputs
    ctx.save_for_backward(cos, sin)
    ctx.unsqueeze_dim = unsqueeze_dim


def _rotary_grad(backward: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Any, ...]]:
    """The backward formula, running the backward problem through `backward` (the custom op, or its body). cos
    and sin get none: a call where they require grad runs torch's formula instead."""

    def grad_of(ctx: Any, grad_q: Tensor, grad_k: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        cos, sin = ctx.saved_tensors
        need_dq, need_dk = ctx.needs_input_grad[:2]
        dq, dk = backward(grad_q, grad_k, cos, sin, ctx.unsqueeze_dim)
        return (dq if need_dq else None, dk if need_dk else None, None, None, None)

    return grad_of


_ROTARY_BACKWARD = declare(OpDeclaration("rotary_embedding_backward", _rotary_backward, _like_inputs))
_ROTARY = declare(
    OpDeclaration(
        "rotary_embedding", _rotary, _like_inputs, Autograd(_rotary_setup, _rotary_grad, through=_ROTARY_BACKWARD)
    )
)


def _heads(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: object = 1) -> tuple[int, ...] | None:
    """(q heads, k heads, head dim, dtype) as kernel_views lays q and k out; None where it would not."""
    heads = _heads_dim(unsqueeze_dim)
    if heads is None or q.dim() != 4 or k.dim() != 4:
        return None
    return q.shape[heads], k.shape[heads], q.shape[-1], DTYPE_NAMES[q.dtype]


_ROPE_SCREEN = Screen(_heads, ("q_heads", "k_heads", "head_dim", "dtype"))


@public_op(_torch_rotary, _ROPE, _ROPE_BACKWARD, runs=_ROTARY, screen=_ROPE_SCREEN)
def rotary_embedding(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim): (q_embed, k_embed)."""
    views = kernel_views(q, k, cos, sin, unsqueeze_dim)
    if views is None or grads_flow(cos, sin):  # torch's formula, and its autograd for cos and sin
        return _torch_rotary(q, k, cos, sin, unsqueeze_dim)
    trains = grads_flow(q, k)
    # torch's formula where it trains: dispatch serves torch for the backward problem (untuned on a GPU)
    if trains and torch_trains_it(_ROPE_BACKWARD, views, q, k, forward=lambda: (_ROPE, views)):
        return _torch_rotary(q, k, cos, sin, unsqueeze_dim)
    return _ROTARY.run(q, k, cos, sin, unsqueeze_dim, trains=trains)
