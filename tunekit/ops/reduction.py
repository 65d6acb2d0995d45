"""tunekit.ops sum / mean / max / softmax / log_softmax: torch's signatures, tuned Triton kernels underneath.

Reductions view the input as [outer, D, inner] around the reduced dim D:
- inner == 1 (the last dim, or only size-1 dims after it): the `inner` kernel over [outer, D];
- otherwise (dim 0, a middle dim, or a whole 1-D tensor): the `outer` kernel over [outer, D, inner], coalesced
  along inner; a middle dim is a batch of `outer` such problems, so nothing is transposed or copied.
A non-contiguous input that is a permutation of a contiguous one (x.t(), x.permute(...)) is reduced in its
memory order without a copy, and the result is permuted back: same values and shape as torch, but for 3-D and
wider inputs the result may be a non-contiguous view (strides in the input's memory order). An input with unit
stride along the relevant dim and other strides that merge (row slices such as x[:, :k]) is read in place. Any
other strided input is copied to contiguous first: correct, one extra pass.

Softmax runs over the last dim directly. For another dim the input is moved to the last dim and made contiguous
(a copy unless that is already its memory order) and the result is moved back: correct, maybe slower.

Each op is a torch custom op (`tunekit::sum_dim`, `mean_dim`, `max_dim`, `softmax`, `log_softmax`) so
torch.compile(fullgraph=True) traces through it; eager calls skip the custom-op layer unless gradients are
needed. Backward formulas are plain torch (not tuned kernels).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.library import CustomOpDef

from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES
from tunekit.kernels.reduction.reduction import torch_reduction
from tunekit.kernels.softmax.softmax import torch_softmax
from tunekit.ops._checks import check_device, use_custom_op
from tunekit.ops._launch import dispatch_launch, kernel_op, served_by
from tunekit.runtime.dispatch import dispatcher
from tunekit.runtime.hotpath import hot_path

__all__ = ["log_softmax", "max", "mean", "softmax", "sum"]

_REDUCTION = dispatcher("reduction")
_SOFTMAX = dispatcher("softmax")
_REDUCTION_SERVED_BY = served_by(_REDUCTION)
_SOFTMAX_SERVED_BY = served_by(_SOFTMAX)
_INDEX_LIMIT = 2**31 - 1  # the kernels index with int32

DimArg = int | Sequence[int] | None


# ---------------------------------------------------------------------------------------------- validation


def _check_input(input: object, op: str) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise InvalidInputError(f"{op}: input must be a tensor, but got {type(input).__name__}")
    if input.dtype not in DTYPE_NAMES:
        raise InvalidInputError(
            f"{op}: input dtype must be one of {sorted(DTYPE_NAMES.values())}, but got {input.dtype}"
        )
    check_device(input, f"{op} input")
    return input


def _check_dtype_arg(dtype: object, op: str) -> None:
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise InvalidInputError(f"{op}: dtype must be None or one of {sorted(DTYPE_NAMES.values())}, but got {dtype}")


def _normalize_dim(dim: object, ndim: int, op: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise InvalidInputError(f"{op}: dim must be an int, but got {type(dim).__name__} {dim!r}")
    rank = builtins.max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, like torch
    if not -rank <= dim < rank:
        raise InvalidInputError(f"{op}: dim must be in [{-rank}, {rank - 1}] for a {ndim}-D input, but got {dim}")
    return dim % rank


def _normalize_dims(dim: object, ndim: int, op: str) -> list[int]:
    """Sorted non-negative dims. None or () reduces every dim (as torch does); several dims must be adjacent."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(builtins.max(ndim, 1)))
    if isinstance(dim, (tuple, list)):
        dims = sorted(_normalize_dim(d, ndim, op) for d in dim)
        if len(set(dims)) != len(dims):
            raise InvalidInputError(f"{op}: each dim may appear once, but got dim={tuple(dim)}")
        if dims != list(range(dims[0], dims[-1] + 1)):
            raise InvalidInputError(
                f"{op}: several dims must be adjacent (they are merged into one), but got dim={tuple(dim)}; "
                "reduce them one at a time instead"
            )
        return dims
    return [_normalize_dim(dim, ndim, op)]


def _check_sizes(shape: Sequence[int], op: str) -> None:
    for size in shape:
        if size >= _INDEX_LIMIT:
            raise InvalidInputError(f"{op}: every dim must be < 2**31 - 1 (int32 indexing), but got {list(shape)}")


def _cast(x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.dtype]:
    """torch's `dtype=` semantics: the input is cast to dtype first. Widening fp16/bf16 -> fp32 is exact, so the
    kernel reads the original and writes fp32 instead (no extra pass)."""
    if dtype is None or dtype == x.dtype:
        return x, x.dtype
    if dtype == torch.float32:
        return x, dtype
    return x.to(dtype), dtype


# ---------------------------------------------------------------------------------------------- reductions


@dataclass(frozen=True)
class _Layout:
    """How a reduction runs: `xv` is the input (permuted into memory order when that avoids a copy)."""

    xv: torch.Tensor
    dims: list[int]  # reduced dims of xv, adjacent
    perm: list[int] | None  # xv = x.permute(perm), or None
    outer: int
    length: int  # D, the reduced size
    inner: int


def _layout(x: torch.Tensor, dims: list[int]) -> _Layout:
    """Metadata only (also runs on fake tensors under torch.compile)."""
    xv, vdims, perm = x, dims, None
    if x.dim() > 1 and not x.is_contiguous():
        strides = x.stride()
        order = sorted(range(x.dim()), key=lambda i: -strides[i])
        candidate = x.permute(order)
        pdims = sorted(order.index(d) for d in dims)
        if candidate.is_contiguous() and pdims == list(range(pdims[0], pdims[-1] + 1)):
            xv, vdims, perm = candidate, pdims, order
    shape = list(xv.shape)
    outer = math.prod(shape[: vdims[0]])
    length = math.prod(shape[vdims[0] : vdims[-1] + 1])
    inner = math.prod(shape[vdims[-1] + 1 :])
    return _Layout(xv, vdims, perm, outer, length, inner)


def _finish(t: torch.Tensor, layout: _Layout, dims: list[int], keepdim: bool, ndim: int) -> torch.Tensor:
    """From the kept-dims buffer in xv's order to torch's result: permute back, drop reduced dims."""
    if ndim == 0:
        return t.reshape(())
    if layout.perm is not None:
        t = t.permute([layout.perm.index(i) for i in range(ndim)])
    return t if keepdim else t.squeeze(tuple(dims))


def _reduce(
    op: str, input: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype | None, run: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values, indices or None). With run=False only the outputs' metadata is built (the fake kernel)."""
    ndim = input.dim()
    x, out_dtype = _cast(input, dtype)
    if ndim == 0:
        x = x.reshape(1)
    layout = _layout(x, dims)
    kept = [1 if i in layout.dims else s for i, s in enumerate(layout.xv.shape)]
    values = torch.empty(kept, device=x.device, dtype=out_dtype)
    indices = torch.empty(kept, device=x.device, dtype=torch.int64) if op == "max" else None
    if run:
        _run_reduction(op, layout, values, indices)
    out_indices = None if indices is None else _finish(indices, layout, dims, keepdim, ndim)
    return _finish(values, layout, dims, keepdim, ndim), out_indices


def _run_reduction(op: str, layout: _Layout, values: torch.Tensor, indices: torch.Tensor | None) -> None:
    outer, length, inner = layout.outer, layout.length, layout.inner
    if values.numel() == 0:
        return
    if length == 0:  # torch: the sum of nothing is 0, the mean NaN (max over an empty dim was refused)
        values.fill_(0.0 if op == "sum" else float("nan"))
        return
    x = layout.xv.reshape(outer, length, inner)  # a view unless xv is strided in a way that cannot merge
    kept: tuple[int, ...]  # the outputs' shape as the kernel writes them
    if inner == 1 and outer > 1:  # the `inner` kernel over [outer, D]
        x, axis, kept = x[:, :, 0], "inner", (outer,)
        if length > 1 and x.stride(1) != 1:
            x = x.contiguous()
    else:  # dim 0, a middle dim, or a whole vector (outer == inner == 1: M rows of one column, coalesced along M)
        axis, kept = "outer", (outer, inner)
        if inner > 1 and x.stride(2) != 1:
            x = x.contiguous()
    outputs = (values.view(kept),) if indices is None else (values.view(kept), indices.view(kept))
    inputs = (x, op, axis)
    if not dispatch_launch(_REDUCTION, inputs, outputs):
        torch_reduction(inputs, outputs)


def _reduced_size(input: torch.Tensor, dims: list[int]) -> int:
    return 1 if input.dim() == 0 else math.prod(input.shape[d] for d in dims)


def _sum_mean_backward_shape(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    if len(ctx.shape) == 0:
        return grad.reshape(())
    if not ctx.keepdim:
        for d in ctx.dims:
            grad = grad.unsqueeze(d)
    return grad.expand(ctx.shape)


def _setup_sum_mean(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    input, dims, keepdim, _ = inputs
    ctx.shape, ctx.in_dtype, ctx.dims, ctx.keepdim = tuple(input.shape), input.dtype, list(dims), keepdim
    ctx.count = _reduced_size(input, list(dims))


def _sum_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
    return _sum_mean_backward_shape(ctx, grad).to(ctx.in_dtype), None, None, None


def _mean_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
    return (_sum_mean_backward_shape(ctx, grad) / ctx.count).to(ctx.in_dtype), None, None, None


def _define_sum_or_mean_op(op: str, backward: Callable[..., tuple[Any, ...]]) -> CustomOpDef:
    """The custom op tunekit::{op}_dim (op: sum or mean), its fake (the outputs' metadata only) and its backward."""

    def kernel(input: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
        return _reduce(op, input, list(dims), keepdim, dtype, run=True)[0]

    def fake(input: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
        return _reduce(op, input, list(dims), keepdim, dtype, run=False)[0]

    custom = kernel_op(f"{op}_dim")(kernel)
    custom.register_fake(fake)
    custom.register_autograd(backward, setup_context=_setup_sum_mean)
    return custom


_sum_op = _define_sum_or_mean_op("sum", _sum_backward)
_mean_op = _define_sum_or_mean_op("mean", _mean_backward)


@kernel_op("max_dim")
def _max_op(input: torch.Tensor, dim: int, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = _reduce("max", input, [dim], keepdim, None, run=True)
    assert indices is not None  # max always returns indices
    return values, indices


@_max_op.register_fake
def _max_fake(input: torch.Tensor, dim: int, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = _reduce("max", input, [dim], keepdim, None, run=False)
    assert indices is not None  # max always returns indices
    return values, indices


def _setup_max(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    input, dim, keepdim = inputs
    ctx.shape, ctx.dim, ctx.keepdim = tuple(input.shape), dim, keepdim
    ctx.save_for_backward(output[1])


def _max_backward(
    ctx: Any, grad_values: torch.Tensor, grad_indices: torch.Tensor | None
) -> tuple[torch.Tensor, None, None]:
    (indices,) = ctx.saved_tensors
    if len(ctx.shape) == 0:
        return grad_values.reshape(()), None, None
    if not ctx.keepdim:
        grad_values, indices = grad_values.unsqueeze(ctx.dim), indices.unsqueeze(ctx.dim)
    grad = torch.zeros(ctx.shape, device=grad_values.device, dtype=grad_values.dtype)
    return grad.scatter(ctx.dim, indices, grad_values), None, None


_max_op.register_autograd(_max_backward, setup_context=_setup_max)


def _sum_or_mean(op: str, input: torch.Tensor, dim: DimArg, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    _check_input(input, op)
    _check_dtype_arg(dtype, op)
    dims = _normalize_dims(dim, input.dim(), op)
    _check_sizes(input.shape, op)
    if use_custom_op(input):
        custom = torch.ops.tunekit.sum_dim if op == "sum" else torch.ops.tunekit.mean_dim
        return custom(input, dims, bool(keepdim), dtype)
    return _reduce(op, input, dims, bool(keepdim), dtype, run=True)[0]


@hot_path(torch.sum, **_REDUCTION_SERVED_BY)
def sum(input: torch.Tensor, dim: DimArg, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.sum(input, dim, keepdim, dtype=dtype) with fp32 accumulation. `dim`: an int, adjacent dims, or None."""
    return _sum_or_mean("sum", input, dim, keepdim, dtype)


@hot_path(torch.mean, **_REDUCTION_SERVED_BY)
def mean(input: torch.Tensor, dim: DimArg, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.mean(input, dim, keepdim, dtype=dtype) with fp32 accumulation; the mean over an empty dim is NaN."""
    return _sum_or_mean("mean", input, dim, keepdim, dtype)


@hot_path(torch.max, **_REDUCTION_SERVED_BY)
def max(input: torch.Tensor, dim: int, keepdim: bool = False) -> torch.return_types.max:
    """torch.max(input, dim, keepdim): (values, indices), the first index of the max; NaN wins (first NaN)."""
    _check_input(input, "max")
    d = _normalize_dim(dim, input.dim(), "max")
    _check_sizes(input.shape, "max")
    if input.dim() > 0 and input.shape[d] == 0:
        raise InvalidInputError(
            f"max: the reduced dim must be non-empty (there is no maximum of nothing), but dim {dim} of shape "
            f"{list(input.shape)} has size 0"
        )
    if use_custom_op(input):
        values, indices = torch.ops.tunekit.max_dim(input, d, bool(keepdim))
    else:
        values, indices = _reduce("max", input, [d], bool(keepdim), None, run=True)
    return torch.return_types.max((values, indices))


# ---------------------------------------------------------------------------------------------- softmax


def _softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None, log: bool, run: bool) -> torch.Tensor:
    x, out_dtype = _cast(input, dtype)
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


def _define_softmax_op(log: bool, backward: Callable[..., tuple[Any, ...]]) -> CustomOpDef:
    """The custom op tunekit::softmax (log: tunekit::log_softmax), its fake (the output's metadata only) and its
    backward."""

    def kernel(input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
        return _softmax(input, dim, dtype, log=log, run=True)

    def fake(input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
        return _softmax(input, dim, dtype, log=log, run=False)

    custom = kernel_op("log_softmax" if log else "softmax")(kernel)
    custom.register_fake(fake)
    custom.register_autograd(backward, setup_context=_setup_softmax)
    return custom


_softmax_op = _define_softmax_op(False, _softmax_backward)
_log_softmax_op = _define_softmax_op(True, _log_softmax_backward)


def _softmax_call(input: torch.Tensor, dim: int, dtype: torch.dtype | None, log: bool) -> torch.Tensor:
    op = "log_softmax" if log else "softmax"
    x = _check_input(input, op)
    _check_dtype_arg(dtype, op)
    d = _normalize_dim(dim, x.dim(), op)
    _check_sizes(x.shape, op)
    if use_custom_op(x):
        return (torch.ops.tunekit.log_softmax if log else torch.ops.tunekit.softmax)(x, d, dtype)
    return _softmax(x, d, dtype, log=log, run=True)


@hot_path(torch.softmax, **_SOFTMAX_SERVED_BY)
def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.softmax(input, dim, dtype): fp32 math. A dim other than the last is moved there (maybe a copy)."""
    return _softmax_call(input, dim, dtype, log=False)


@hot_path(torch.log_softmax, **_SOFTMAX_SERVED_BY)
def log_softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.log_softmax(input, dim, dtype): fp32 math. A dim other than the last is moved there (maybe a copy)."""
    return _softmax_call(input, dim, dtype, log=True)
