"""tunekit.ops.cross_entropy: F.cross_entropy over 2-D logits, the loss and its gradient from one fused kernel.

The `cross_entropy` kernel reads the logits once (fp32 math, online logsumexp) and, when gradients flow, writes
d(loss)/d(logits) for grad_output = 1 in the logits' dtype during the forward (Liger-Kernel's approach). That buffer
is what autograd saves (instead of the logits); the backward scales it by grad_output: in place in eager mode (a
saved gradient serves one backward: a second one through a retained graph raises torch's in-place error), out of
place under torch.compile. Double backward is not supported (eager raises).

Semantics are F.cross_entropy's for 2-D logits [N, V] (fp16/bf16/fp32) and int64 class targets [N]: mean over the
non-ignored targets (NaN if none), sum, or none (ignored rows 0), in the logits' dtype. Everything else the kernel
does not take runs torch's own F.cross_entropy: other ranks, weights, label smoothing, probabilities as targets,
other dtypes, tensors off the kernel's device, no rows. A target outside [0, V) other than ignore_index reads
nothing out of bounds: its row's loss (so a mean or sum) and gradient are NaN, where torch raises a device assert.

The op is a torch custom op (`torch.ops.tunekit.cross_entropy`, returning the loss and the gradient buffer) for
torch.compile(fullgraph=True); eager calls whose gradients flow run the same body in an autograd Function
(tunekit/runtime/eager_autograd.py); other eager calls launch directly, without writing the gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tunekit.core import backend
from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES
from tunekit.kernels.softmax.cross_entropy import REDUCTIONS, loss_and_grad
from tunekit.ops._checks import check_device, dtype_name, grads_flow
from tunekit.ops._launch import dispatch_launch, kernel_op, served_by, torch_trains_it, trainable
from tunekit.runtime.dispatch import TORCH, dispatcher
from tunekit.runtime.hotpath import hot_path

_CE = dispatcher("cross_entropy")
_DEVICE_TYPE = backend.torch_device().type
_INDEX_LIMIT = 2**31 - 1  # the kernels index columns and targets with int32


def _torch_cross_entropy(
    input: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    weight: Tensor | None = None,
) -> Tensor:
    """torch's own F.cross_entropy with this op's signature (what the hot path calls where torch serves)."""
    return F.cross_entropy(
        input, target, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )


def _kernel_takes(input: object, target: object, ignore_index: object, reduction: object, smoothing: object) -> bool:
    """Whether the kernel computes this call exactly as torch does; anything else runs torch's own op."""
    return (
        isinstance(input, Tensor)
        and isinstance(target, Tensor)
        and input.dim() == 2
        and target.dim() == 1
        and target.dtype == torch.int64
        and input.dtype in DTYPE_NAMES
        and input.device.type == _DEVICE_TYPE
        and target.device == input.device
        and 0 < input.shape[0] == target.shape[0]
        and 0 < input.shape[1] < _INDEX_LIMIT
        and type(ignore_index) is int
        and reduction in REDUCTIONS
        and smoothing == 0.0
        and type(smoothing) in (int, float)
    )


def kernel_serves(input: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean") -> bool:
    """Whether this call runs the fused kernel (not torch's op): what it takes, and a config dispatch serves."""
    if not _kernel_takes(input, target, ignore_index, reduction, 0.0):
        return False
    return _CE.config(_CE.spec.key_of((*_rows(input, target), ignore_index, reduction))) is not TORCH


def _rows(input: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """The logits with unit stride along V and contiguous targets (a copy only where needed)."""
    x = input if input.stride(1) == 1 or input.shape[1] == 1 else input.contiguous()
    return x, target.contiguous()


def _buffers(input: Tensor, reduction: str, want_grad: bool) -> tuple[Tensor, Tensor]:
    """(loss, grad): loss [] or [N] (none) in the logits' dtype; grad like input, or an empty [0] tensor."""
    loss = input.new_empty((input.shape[0],) if reduction == "none" else ())
    return loss, input.new_empty(input.shape) if want_grad else input.new_empty(0)


def _cross_entropy(
    input: Tensor, target: Tensor, ignore_index: int, reduction: str, want_grad: bool
) -> tuple[Tensor, Tensor]:
    """(loss, d(loss)/d(input) for grad_output = 1, or an empty [0] tensor without want_grad). Where dispatch
    serves torch: F.cross_entropy without want_grad, else torch ops in fp32 (the kernel's formula, rounded to the
    logits' dtype)."""
    loss, grad = _buffers(input, reduction, want_grad)
    x, t = _rows(input, target)
    inputs = (x, t, ignore_index, reduction)
    if dispatch_launch(_CE, inputs, (loss, grad) if want_grad else (loss,)):
        return loss, grad
    if not want_grad:  # torch's own op, as a user runs it
        return _torch_cross_entropy(x, t, ignore_index, reduction), grad
    torch_loss, torch_grad = loss_and_grad(x.float(), t, ignore_index, reduction)
    return torch_loss.to(input.dtype), torch_grad.to(input.dtype)


@kernel_op("cross_entropy")
def _cross_entropy_op(
    input: Tensor, target: Tensor, ignore_index: int, reduction: str, want_grad: bool
) -> tuple[Tensor, Tensor]:
    return _cross_entropy(input, target, ignore_index, reduction, want_grad)


@_cross_entropy_op.register_fake
def _cross_entropy_fake(
    input: Tensor, target: Tensor, ignore_index: int, reduction: str, want_grad: bool
) -> tuple[Tensor, Tensor]:
    return _buffers(input, reduction, want_grad)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.reduction = inputs[3]
    ctx.save_for_backward(output[1])


def _per_row(grad_loss: Tensor, reduction: str) -> Tensor:
    """grad_output broadcast over the gradient's rows: a scalar, or a column for reduction none."""
    return grad_loss[:, None] if reduction == "none" else grad_loss


def _scaled(grad: Tensor, grad_loss: Tensor, reduction: str) -> Tensor:
    """Out of place (what torch.compile traces)."""
    return grad * _per_row(grad_loss, reduction)


def _scaled_in_place(grad: Tensor, grad_loss: Tensor, reduction: str) -> Tensor:
    """In place on the saved buffer (eager): no second [N, V] tensor."""
    return grad.mul_(_per_row(grad_loss, reduction))


def _grad(backward: Callable[[Tensor, Tensor, str], Tensor]) -> Callable[..., tuple[Any, ...]]:
    def grad_of(ctx: Any, grad_loss: Tensor, _grad_buffer: Tensor | None) -> tuple[Tensor, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return backward(grad, grad_loss, ctx.reduction), None, None, None, None

    return grad_of


_CROSS_ENTROPY_EAGER = trainable(
    "CrossEntropyEager", _cross_entropy_op, _cross_entropy, _setup, _grad, _scaled, _scaled_in_place
)


@hot_path(_torch_cross_entropy, **served_by(_CE))
def cross_entropy(
    input: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    weight: Tensor | None = None,
) -> Tensor:
    """F.cross_entropy(input, target, weight, ignore_index=..., reduction=..., label_smoothing=...). The fused
    kernel serves 2-D logits with int64 class targets, no weight and no label smoothing; torch the rest."""
    if not isinstance(input, Tensor):
        raise InvalidInputError(f"input must be a tensor of logits, but got {type(input).__name__}")
    dtype_name(input, "input")  # as every op: the kernels' dtypes on the kernels' device, else a clear error
    check_device(input, "input")
    if weight is not None or not _kernel_takes(input, target, ignore_index, reduction, label_smoothing):
        return _torch_cross_entropy(input, target, ignore_index, reduction, label_smoothing, weight=weight)
    trains = grads_flow(input)
    if trains and torch_trains_it(_CE, (input, target, ignore_index, reduction), input):
        return _torch_cross_entropy(input, target, ignore_index, reduction)
    if torch.compiler.is_compiling():
        return torch.ops.tunekit.cross_entropy(input, target, ignore_index, reduction, input.requires_grad)[0]
    if trains:
        return _CROSS_ENTROPY_EAGER.apply(input, target, ignore_index, reduction, True)[0]
    loss, _ = _cross_entropy(input, target, ignore_index, reduction, False)
    return loss
