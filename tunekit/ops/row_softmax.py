"""tunekit.ops softmax, log_softmax and cross_entropy: the row-softmax family (kernels/row_softmax/).

softmax and log_softmax run over the last dim directly. For another dim the input is moved to the last dim and made
contiguous (a copy unless that is already its memory order) and the result is moved back: correct, maybe slower.
Each is a torch custom op (`tunekit::softmax`, `tunekit::log_softmax`) so torch.compile(fullgraph=True) traces
through it; eager calls skip the custom-op layer unless gradients are needed. Their backward formulas are plain
torch (not tuned kernels).

cross_entropy: F.cross_entropy over 2-D logits, the loss and its gradient from one fused kernel.
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
from tunekit.core.spec import DTYPE_NAMES, row_bucket
from tunekit.kernels.row_softmax.cross_entropy import REDUCTIONS, loss_and_grad
from tunekit.kernels.row_softmax.softmax import torch_softmax
from tunekit.ops._checks import (
    INDEX_LIMIT,
    cast,
    check_device,
    check_dtype_arg,
    check_input,
    check_sizes,
    dtype_name,
    grads_flow,
    normalize_dim,
    read_dtype,
    use_custom_op,
)
from tunekit.ops._launch import dispatch_launch, torch_trains_it
from tunekit.ops.declaration import Autograd, DeclaredOp, OpDeclaration, Runs, Screen, declare, public_op
from tunekit.runtime.dispatch import TORCH, dispatcher

__all__ = ["cross_entropy", "log_softmax", "softmax"]

_SOFTMAX = dispatcher("softmax")
_CE = dispatcher("cross_entropy")
_DEVICE_TYPE = backend.torch_device().type


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
        and 0 < input.shape[1] < INDEX_LIMIT
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


# The saved gradient is scaled out of place where torch.compile traces it, in place eagerly (no second [N, V] tensor).
_CROSS_ENTROPY = declare(
    OpDeclaration(
        "cross_entropy", _cross_entropy, _cross_entropy_fake, Autograd(_setup, _grad, Runs(_scaled, _scaled_in_place))
    )
)


def _logits_rows(input: Tensor, *_: object, **__: object) -> tuple[int, int, str]:
    # the kernel serves 2-D logits [N, C], torch the rest
    return row_bucket(input.shape[0]), input.shape[-1], DTYPE_NAMES[input.dtype]


@public_op(_torch_cross_entropy, _CE, runs=_CROSS_ENTROPY, screen=Screen(_logits_rows, ("rows", "cols", "dtype")))
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
    # the gradient is written during the forward only where autograd may ask for it
    want_grad = input.requires_grad if torch.compiler.is_compiling() else trains
    return _CROSS_ENTROPY.run(input, target, ignore_index, reduction, want_grad, trains=trains)[0]


# ---------------------------------------------------------------------------------------------- softmax


def _softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None, log: bool, run: bool) -> torch.Tensor:
    x, out_dtype = cast(input, dtype)
    ndim = x.dim()
    if ndim == 0:
        x = x.reshape(1)
    last = dim == x.dim() - 1
    xm = x if last else x.movedim(dim, -1)
    ym = torch.empty(xm.shape, device=x.device, dtype=out_dtype)
    if run and xm.numel() > 0:
        n = xm.shape[-1]
        x2 = xm.reshape(-1, n)  # a view when the leading dims merge, else a copy
        if n > 1 and x2.stride(1) != 1:
            x2 = x2.contiguous()
        y2 = ym.view(-1, n)
        if not dispatch_launch(_SOFTMAX, (x2, log), (y2,)):  # torch's own softmax, into the same output
            torch_softmax((x2, log), (y2,))
    if ndim == 0:
        return ym.reshape(())
    return ym if last else ym.movedim(-1, dim)


def _setup_softmax(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    input, dim, _ = inputs
    ctx.dim, ctx.in_dtype = dim, input.dtype
    ctx.save_for_backward(output)


def _softmax_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    (y,) = ctx.saved_tensors
    g, y = grad.float(), y.float()
    return (y * (g - (g * y).sum(ctx.dim, keepdim=True))).to(ctx.in_dtype), None, None


def _log_softmax_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    (y,) = ctx.saved_tensors
    g, y = grad.float(), y.float()
    return (g - torch.exp(y) * g.sum(ctx.dim, keepdim=True)).to(ctx.in_dtype), None, None


def _declare_softmax(log: bool, backward: Callable[..., tuple[Any, ...]]) -> DeclaredOp:
    """The op tunekit::softmax (log: tunekit::log_softmax): its fake is the output's metadata only; it trains
    through its custom op (the backward is torch ops)."""

    def body(input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
        return _softmax(input, dim, dtype, log=log, run=True)

    def fake(input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
        return _softmax(input, dim, dtype, log=log, run=False)

    name = "log_softmax" if log else "softmax"
    return declare(OpDeclaration(name, body, fake, Autograd(_setup_softmax, backward)))


_SOFTMAX_OP = _declare_softmax(False, _softmax_backward)
_LOG_SOFTMAX_OP = _declare_softmax(True, _log_softmax_backward)


def _softmax_call(input: torch.Tensor, dim: int, dtype: torch.dtype | None, log: bool) -> torch.Tensor:
    op = "log_softmax" if log else "softmax"
    x = check_input(input, op)
    check_dtype_arg(dtype, op)
    d = normalize_dim(dim, x.dim(), op)
    check_sizes(x.shape, op)
    return (_LOG_SOFTMAX_OP if log else _SOFTMAX_OP).run(x, d, dtype, trains=use_custom_op(x))


def _softmax_rows(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> tuple[int, int, str]:
    """(bucketed rows, row length, dtype) of the kernel's view: `dim` moved last; a cast to fp32 reads the input
    as it is (cast), any other cast the cast tensor."""
    cols = input.shape[dim] if input.dim() else 1
    return row_bucket(input.numel() // cols if cols else 0), cols, DTYPE_NAMES[read_dtype(input.dtype, dtype)]


_SOFTMAX_SCREEN = Screen(_softmax_rows, ("rows", "cols", "dtype"))


@public_op(torch.softmax, _SOFTMAX, runs=_SOFTMAX_OP, screen=_SOFTMAX_SCREEN)
def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.softmax(input, dim, dtype): fp32 math. A dim other than the last is moved there (maybe a copy)."""
    return _softmax_call(input, dim, dtype, log=False)


@public_op(torch.log_softmax, _SOFTMAX, runs=_LOG_SOFTMAX_OP, screen=_SOFTMAX_SCREEN)
def log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.log_softmax(input, dim, dtype): fp32 math. A dim other than the last is moved there (maybe a copy)."""
    return _softmax_call(input, dim, dtype, log=True)
