"""tunekit.ops.layer_norm and rms_norm: torch.nn.functional's signatures, tuned Triton kernels underneath.

Both normalise over the trailing `normalized_shape` dims with fp32 statistics and train through autograd: each is a
torch custom op (`torch.ops.tunekit.layer_norm`, `torch.ops.tunekit.rms_norm`) with a fake (meta) implementation
and a registered backward, itself a custom op (`layer_norm_backward`, `rms_norm_backward`) running the tuned
backward kernel. The backward recomputes the statistics from the saved input, so the forward saves nothing else.
Gradients of weight and bias are computed only for those that require grad. Double backward is not supported.

The eager hot path (no input requires grad, or grad mode off, and not compiling) skips the custom-op dispatch: one
validation, one dispatch lookup, one launch. Eager calls whose gradients flow skip it too: a torch.autograd.Function
(tunekit/runtime/eager_autograd.py) runs the same forward, setup and backward formula as the custom op, without the
custom-op dispatcher's host cost; torch.compile traces the custom ops. Inputs of any leading dims and strides are
accepted (rows whose last dim is strided are copied); results are new contiguous tensors of input's shape and dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES, row_bucket
from tunekit.ops._checks import check_device, check_same_device, dtype_name, grads_flow
from tunekit.ops._launch import dispatch_launch, torch_trains_it
from tunekit.ops.declaration import Autograd, DeclaredOp, OpDeclaration, Screen, declare, public_op
from tunekit.runtime.dispatch import Dispatcher, dispatcher
from tunekit.runtime.eager_autograd import SetupContext

_LAYERNORM = dispatcher("layernorm")
_LAYERNORM_BACKWARD = dispatcher("layernorm_backward")
_RMSNORM = dispatcher("rmsnorm")
_RMSNORM_BACKWARD = dispatcher("rmsnorm_backward")


# ---------------------------------------------------------------------------------------------- validation


def _check_affine(p: Tensor | None, shape: tuple[int, ...], x: Tensor, what: str) -> None:
    if p is None:
        return
    if not isinstance(p, Tensor):
        raise InvalidInputError(f"{what} must be a tensor or None, but got {type(p).__name__}")
    if tuple(p.shape) != shape:
        raise InvalidInputError(f"{what} must have shape normalized_shape={list(shape)}, but got {list(p.shape)}")
    dtype_name(p, what)
    check_same_device(p, x, what)


def _validate(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: object,
) -> tuple[int, ...]:
    """Refuse anything the kernels would get wrong; return normalized_shape as a tuple."""
    if not isinstance(input, Tensor):
        raise InvalidInputError(f"input must be a tensor, but got {type(input).__name__}")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(input.shape[input.dim() - len(shape) :]) != shape or input.dim() < len(shape):
        raise InvalidInputError(
            f"normalized_shape={list(shape)} must match the trailing dims of input of shape {list(input.shape)}"
        )
    dtype_name(input, "input")
    check_device(input, "input")
    _check_affine(weight, shape, input, "weight")
    _check_affine(bias, shape, input, "bias")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise InvalidInputError(f"eps must be a Python float, but got {type(eps).__name__}")
    return shape


def _rows(t: Tensor, n: int) -> Tensor:
    """t as [M, n] with unit stride along n (the kernels take any row stride); a copy only when needed."""
    rows = t.reshape(-1, n)
    if n > 1 and rows.stride(1) != 1:
        rows = rows.contiguous()
    return rows


def _vector(p: Tensor | None, n: int) -> Tensor | None:
    return None if p is None else p.reshape(n).contiguous()


# ---------------------------------------------------------------------------------------------- both norms


def _forward(
    kernel: Dispatcher, input: Tensor, shape: Sequence[int], params: tuple[Tensor | None, ...], eps: float
) -> Tensor | None:
    """A forward kernel over input's [M, N] rows (N = prod(shape)): a new tensor of input's shape and dtype, or
    None where dispatch serves torch."""
    y = input.new_empty(input.shape)
    if input.numel() == 0:
        return y
    n = math.prod(shape)
    inputs = (_rows(input, n), *(_vector(p, n) for p in params), eps)
    return y if dispatch_launch(kernel, inputs, (y.view(-1, n),)) else None


def _like_input(input: Tensor, *_: object) -> Tensor:
    """The forward ops' fake: a new tensor of input's shape and dtype."""
    return input.new_empty(input.shape)


def _grad_buffers(input: Tensor, weight: Tensor | None, shape: Sequence[int], want_dw: bool) -> tuple[Tensor, Tensor]:
    """A backward's dx, and its dweight where wanted, else an empty [0] tensor (a custom op returns no None)."""
    dx = input.new_empty(input.shape)
    return dx, weight.new_empty(tuple(shape)) if want_dw and weight is not None else input.new_empty(0)


def _bias_grad_buffer(input: Tensor, shape: Sequence[int], bias_dtype: torch.dtype | None) -> Tensor:
    """LayerNorm backward's dbias where wanted (bias_dtype given), else an empty [0] tensor."""
    return input.new_empty(tuple(shape), dtype=bias_dtype) if bias_dtype is not None else input.new_empty(0)


def _declare_norm(
    name: str,
    body: Callable[..., Tensor],
    setup: SetupContext,
    formula: Callable[..., Callable[..., tuple[Any, ...]]],
    backward: Callable[..., tuple[Tensor, ...]],
    backward_fake: Callable[..., tuple[Tensor, ...]],
) -> DeclaredOp:
    """The forward op `name` (fake: _like_input), training through its backward op `<name>_backward`."""
    through = declare(OpDeclaration(f"{name}_backward", backward, backward_fake))
    return declare(OpDeclaration(name, body, _like_input, Autograd(setup, formula, through=through)))


def _bucketed_rows(input: Tensor, normalized_shape: int | Sequence[int]) -> tuple[int, int]:
    """(the bucketed row count, the row length) of the kernels' [M, N] view: N the product of normalized_shape."""
    cols = normalized_shape if isinstance(normalized_shape, int) else math.prod(normalized_shape)
    return row_bucket(input.numel() // cols), cols


def _layer_norm_problem(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: object = None,
    bias: object = None,
    eps: object = None,
) -> tuple[object, ...]:
    return *_bucketed_rows(input, normalized_shape), DTYPE_NAMES[input.dtype], weight is not None, bias is not None


def _rms_norm_problem(
    input: Tensor, normalized_shape: int | Sequence[int], weight: object = None, eps: object = None
) -> tuple[object, ...]:
    return *_bucketed_rows(input, normalized_shape), DTYPE_NAMES[input.dtype], weight is not None


# every field of the kernels' problem: the forward kernel serves exactly its key (rows bucketed as the key holds them)
_LAYER_NORM_SCREEN = Screen(_layer_norm_problem, ("rows", "cols", "dtype", "weight", "bias"))
_RMS_NORM_SCREEN = Screen(_rms_norm_problem, ("rows", "cols", "dtype", "weight"))


# The ops' torch fallbacks, with the fronts' signatures: torch's norms take normalized_shape as a sequence only.
Shape = int | Sequence[int]
Param = Tensor | None


def _torch_layer_norm(
    input: Tensor, normalized_shape: Shape, weight: Param = None, bias: Param = None, eps: float = 1e-5
) -> Tensor:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    return F.layer_norm(input, shape, weight, bias, eps)


def _torch_rms_norm(input: Tensor, normalized_shape: Shape, weight: Param = None, eps: float | None = None) -> Tensor:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    return F.rms_norm(input, shape, weight, eps)


def _rows_like(input: Tensor, n: int) -> Tensor:
    """A [M, n] stand-in of input's dtype, no memory: enough for a kernel's key_of before the real rows exist."""
    return input.new_empty(()).expand(input.numel() // max(n, 1), n)


# ---------------------------------------------------------------------------------------------- LayerNorm


def _layer_norm_op_body(
    input: Tensor, normalized_shape: list[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    y = _forward(_LAYERNORM, input, normalized_shape, (weight, bias), eps)
    return F.layer_norm(input, tuple(normalized_shape), weight, bias, eps) if y is None else y


def _layer_norm_backward(
    grad: Tensor,
    input: Tensor,
    weight: Tensor | None,
    normalized_shape: list[int],
    eps: float,
    want_dweight: bool,
    bias_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); dweight / dbias are empty [0] tensors unless wanted (a custom op returns no None)."""
    want_dw, want_db = want_dweight and weight is not None, bias_dtype is not None
    dx, dw = _grad_buffers(input, weight, normalized_shape, want_dw)
    db = _bias_grad_buffer(input, normalized_shape, bias_dtype)
    if input.numel() == 0:  # dweight and dbias are sums over no rows
        return dx, dw.zero_(), db.zero_()
    n = math.prod(normalized_shape)
    x2d, dy2d = _rows(input, n), _rows(grad, n)
    inputs = (x2d, dy2d, _vector(weight, n), want_dw, want_db, eps)
    outputs = (dx.view(-1, n),) + ((dw.view(n),) if want_dw else ()) + ((db.view(n),) if want_db else ())
    if dispatch_launch(_LAYERNORM_BACKWARD, inputs, outputs):
        return dx, dw, db
    # torch's own backward; its statistics recomputed (the forward did not save them)
    shape_list, w = list(normalized_shape), weight.reshape(normalized_shape) if weight is not None else None
    _, mean, rstd = torch.ops.aten.native_layer_norm(input, shape_list, w, None, eps)
    bias_like = input.new_empty(shape_list) if want_db else None
    mask = [True, want_dw, want_db]
    gx, gw, gb = torch.ops.aten.native_layer_norm_backward(grad, input, shape_list, mean, rstd, w, bias_like, mask)
    return gx, gw if want_dw else dw, gb.to(db.dtype) if want_db else db


def _layer_norm_backward_fake(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
    _, input, weight, shape, _, want_dweight, bias_dtype = args  # the op's arguments
    return (*_grad_buffers(input, weight, shape, want_dweight), _bias_grad_buffer(input, shape, bias_dtype))


def _layer_norm_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    input, normalized_shape, weight, bias, eps = inputs
    ctx.save_for_backward(input, weight)
    ctx.normalized_shape, ctx.eps = list(normalized_shape), eps
    ctx.bias_dtype = None if bias is None else bias.dtype


def _layer_norm_grad(backward: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> Callable[..., tuple[Any, ...]]:
    """The backward formula, running the backward problem through `backward` (the custom op, or its body)."""

    def grad_of(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Any, Any, None]:
        input, weight = ctx.saved_tensors
        need_dx, _, need_dw, need_db, _ = ctx.needs_input_grad
        want_dw = weight is not None and need_dw
        bias_dtype = ctx.bias_dtype if need_db else None
        dx, dw, db = backward(grad, input, weight, ctx.normalized_shape, ctx.eps, want_dw, bias_dtype)
        return (dx if need_dx else None, None, dw if want_dw else None, db if bias_dtype is not None else None, None)

    return grad_of


_LAYER_NORM = _declare_norm(
    "layer_norm",
    _layer_norm_op_body,
    _layer_norm_setup,
    _layer_norm_grad,
    _layer_norm_backward,
    _layer_norm_backward_fake,
)


@public_op(_torch_layer_norm, _LAYERNORM, _LAYERNORM_BACKWARD, runs=_LAYER_NORM, screen=_LAYER_NORM_SCREEN)
def layer_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """LayerNorm over the trailing `normalized_shape` dims, with fp32 statistics. Same contract as torch's."""
    shape = _validate(input, normalized_shape, weight, bias, eps)
    trains = grads_flow(input, weight, bias)
    if trains:
        n, want_db = math.prod(shape), bias is not None and bias.requires_grad
        rows = _rows_like(input, n)
        # torch's whole op where it trains: its autograd saves the statistics the backward would recompute
        backward = (rows, rows, weight, True, want_db, float(eps))
        forward = lambda: (_LAYERNORM, (rows, weight, bias, float(eps)))  # noqa: E731
        if torch_trains_it(_LAYERNORM_BACKWARD, backward, input, weight, bias, forward=forward):
            return F.layer_norm(input, tuple(shape), weight, bias, float(eps))
    return _LAYER_NORM.run(input, list(shape), weight, bias, float(eps), trains=trains)


# ---------------------------------------------------------------------------------------------- RMSNorm


def _rms_norm_op_body(input: Tensor, normalized_shape: list[int], weight: Tensor | None, eps: float) -> Tensor:
    y = _forward(_RMSNORM, input, normalized_shape, (weight,), eps)
    return F.rms_norm(input, tuple(normalized_shape), weight, eps) if y is None else y


def _rms_norm_backward(
    grad: Tensor, input: Tensor, weight: Tensor | None, normalized_shape: list[int], eps: float, want_dweight: bool
) -> tuple[Tensor, Tensor]:
    """(dx, dweight); dweight is an empty [0] tensor unless wanted."""
    want_dw = want_dweight and weight is not None
    dx, dw = _grad_buffers(input, weight, normalized_shape, want_dw)
    if input.numel() == 0:  # dweight is a sum over no rows
        return dx, dw.zero_()
    n = math.prod(normalized_shape)
    x2d, dy2d = _rows(input, n), _rows(grad, n)
    inputs = (x2d, dy2d, _vector(weight, n), want_dw, eps)
    if dispatch_launch(_RMSNORM_BACKWARD, inputs, (dx.view(-1, n), dw.view(n)) if want_dw else (dx.view(-1, n),)):
        return dx, dw
    # torch ops in fp32 (torch has no public fused RMSNorm backward to call)
    xf, dyf = x2d.float(), dy2d.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    dxhat = dyf * weight.reshape(n).float() if weight is not None else dyf
    dx.view(-1, n).copy_(rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True)))
    if want_dw:
        dw.view(n).copy_((dyf * xhat).sum(0))
    return dx, dw


def _rms_norm_backward_fake(
    grad: Tensor, input: Tensor, weight: Tensor | None, normalized_shape: list[int], eps: float, want_dweight: bool
) -> tuple[Tensor, Tensor]:
    return _grad_buffers(input, weight, normalized_shape, want_dweight)


def _rms_norm_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    input, normalized_shape, weight, eps = inputs
    ctx.save_for_backward(input, weight)
    ctx.normalized_shape, ctx.eps = list(normalized_shape), eps


def _rms_norm_grad(backward: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Any, ...]]:
    """The backward formula, running the backward problem through `backward` (the custom op, or its body)."""

    def grad_of(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Any, None]:
        input, weight = ctx.saved_tensors
        need_dx, _, need_dw, _ = ctx.needs_input_grad
        want_dw = weight is not None and need_dw
        dx, dw = backward(grad, input, weight, ctx.normalized_shape, ctx.eps, want_dw)
        return (dx if need_dx else None, None, dw if want_dw else None, None)

    return grad_of


_RMS_NORM = _declare_norm(
    "rms_norm", _rms_norm_op_body, _rms_norm_setup, _rms_norm_grad, _rms_norm_backward, _rms_norm_backward_fake
)


@public_op(_torch_rms_norm, _RMSNORM, _RMSNORM_BACKWARD, runs=_RMS_NORM, screen=_RMS_NORM_SCREEN)
def rms_norm(
    input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None, eps: float | None = None
) -> Tensor:
    """RMSNorm over the trailing `normalized_shape` dims, fp32 statistics; eps None means finfo(input.dtype).eps."""
    shape = _validate(input, normalized_shape, weight, None, 0.0 if eps is None else eps)
    eps_value = torch.finfo(input.dtype).eps if eps is None else float(eps)
    trains = grads_flow(input, weight)
    if trains:
        rows = _rows_like(input, math.prod(shape))
        forward = lambda: (_RMSNORM, (rows, weight, eps_value))  # noqa: E731
        if torch_trains_it(_RMSNORM_BACKWARD, (rows, rows, weight, True, eps_value), input, weight, forward=forward):
            return F.rms_norm(input, tuple(shape), weight, eps_value)
    return _RMS_NORM.run(input, list(shape), weight, eps_value, trains=trains)
