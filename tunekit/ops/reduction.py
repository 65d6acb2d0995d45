"""tunekit.ops sum / mean / max: torch's signatures, tuned Triton kernels underneath.

Reductions view the input as [outer, D, inner] around the reduced dim D:
- inner == 1 (the last dim, or only size-1 dims after it): the `inner` kernel over [outer, D];
- otherwise (dim 0, a middle dim, or a whole 1-D tensor): the `outer` kernel over [outer, D, inner], coalesced
  along inner; a middle dim is a batch of `outer` such problems, so nothing is transposed or copied.
A non-contiguous input that is a permutation of a contiguous one (x.t(), x.permute(...)) is reduced in its
memory order without a copy, and the result is permuted back: same values and shape as torch, but for 3-D and
wider inputs the result may be a non-contiguous view (strides in the input's memory order). An input with unit
stride along the relevant dim and other strides that merge (row slices such as x[:, :k]) is read in place. Any
other strided input is copied to contiguous first: correct, one extra pass.

Each op is a torch custom op (`tunekit::sum_dim`, `mean_dim`, `max_dim`; declaration.py) so
torch.compile(fullgraph=True) traces through it; eager calls skip the custom-op layer unless gradients are
needed. Backward formulas are plain torch (not tuned kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES, row_bucket
from tunekit.kernels.reduction.reduction import torch_reduction
from tunekit.ops._checks import (
    cast,
    check_dtype_arg,
    check_input,
    check_sizes,
    normalize_dim,
    normalize_dims,
    read_dtype,
    use_custom_op,
)
from tunekit.ops._launch import dispatch_launch
from tunekit.ops.declaration import Autograd, DeclaredOp, OpDeclaration, Screen, declare, public_op
from tunekit.runtime.dispatch import dispatcher

__all__ = ["max", "mean", "sum"]

_REDUCTION = dispatcher("reduction")

DimArg = int | Sequence[int] | None


# ---------------------------------------------------------------------------------------------- validation


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
    return _Layout(xv, vdims, perm, *_extents(xv.shape, vdims[0], vdims[-1]))


def _extents(shape: Sequence[int], first: int, last: int) -> tuple[int, int, int]:
    """(outer, length, inner): the sizes before, across and after the reduced dims first..last."""
    return math.prod(shape[:first]), math.prod(shape[first : last + 1]), math.prod(shape[last + 1 :])


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
    x, out_dtype = cast(input, dtype)
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


def _declare_sum_or_mean(op: str, backward: Callable[..., tuple[Any, ...]]) -> DeclaredOp:
    """The op tunekit::{op}_dim (op: sum or mean): its fake is the outputs' metadata only; it trains through its
    custom op (the backward is torch ops)."""

    def body(input: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
        return _reduce(op, input, list(dims), keepdim, dtype, run=True)[0]

    def fake(input: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
        return _reduce(op, input, list(dims), keepdim, dtype, run=False)[0]

    return declare(OpDeclaration(f"{op}_dim", body, fake, Autograd(_setup_sum_mean, backward)))


_SUM = _declare_sum_or_mean("sum", _sum_backward)
_MEAN = _declare_sum_or_mean("mean", _mean_backward)


def _max_values(input: torch.Tensor, dim: int, keepdim: bool, run: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = _reduce("max", input, [dim], keepdim, None, run=run)
    assert indices is not None  # max always returns indices
    return values, indices


def _max_body(input: torch.Tensor, dim: int, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _max_values(input, dim, keepdim, run=True)


def _max_fake(input: torch.Tensor, dim: int, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _max_values(input, dim, keepdim, run=False)


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


_MAX = declare(OpDeclaration("max_dim", _max_body, _max_fake, Autograd(_setup_max, _max_backward)))


def _sum_or_mean(op: str, input: torch.Tensor, dim: DimArg, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    check_input(input, op)
    check_dtype_arg(dtype, op)
    dims = normalize_dims(dim, input.dim(), op)
    check_sizes(input.shape, op)
    return (_SUM if op == "sum" else _MEAN).run(input, dims, bool(keepdim), dtype, trains=use_custom_op(input))


def _reduction_problem(
    op: str, input: torch.Tensor, dim: DimArg = None, dtype: torch.dtype | None = None
) -> tuple[object, ...] | None:
    """The reduction kernel's whole problem key for a contiguous input, as _run_reduction lays it out and key_of
    buckets it (None: another layout, which _layout may permute)."""
    ndim = input.dim()
    if ndim == 0 or not input.is_contiguous():
        return None
    if type(dim) is int:  # the common call, without normalize_dims' checks (a dim out of range: the full path)
        first = last = dim + ndim if dim < 0 else dim
        if not 0 <= first < ndim:
            return None
    else:
        dims = normalize_dims(dim, ndim, "reduce")
        first, last = dims[0], dims[-1]
    # contiguous: _layout would not permute, so its extents are the shape's own (without building a _Layout)
    outer, length, inner = _extents(input.shape, first, last)
    read = DTYPE_NAMES[read_dtype(input.dtype, dtype)]
    if inner == 1 and outer > 1:
        return (op, "inner", 1, row_bucket(outer), length, read)
    return (op, "outer", row_bucket(outer), row_bucket(length), inner, read)


def _reduction_screen(op: str) -> Screen:
    def of_call(
        input: torch.Tensor, dim: DimArg = None, *_: object, dtype: torch.dtype | None = None, **__: object
    ) -> tuple[object, ...] | None:
        return _reduction_problem(op, input, dim, dtype)

    return Screen(of_call, ("op", "axis", "batch", "rows", "cols", "dtype"))


@public_op(torch.sum, _REDUCTION, runs=_SUM, screen=_reduction_screen("sum"))
def sum(input: torch.Tensor, dim: DimArg, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.sum(input, dim, keepdim, dtype=dtype) with fp32 accumulation. `dim`: an int, adjacent dims, or None."""
    return _sum_or_mean("sum", input, dim, keepdim, dtype)


@public_op(torch.mean, _REDUCTION, runs=_MEAN, screen=_reduction_screen("mean"))
def mean(input: torch.Tensor, dim: DimArg, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.mean(input, dim, keepdim, dtype=dtype) with fp32 accumulation; the mean over an empty dim is NaN."""
    return _sum_or_mean("mean", input, dim, keepdim, dtype)


@public_op(torch.max, _REDUCTION, runs=_MAX, screen=_reduction_screen("max"))
def max(input: torch.Tensor, dim: int, keepdim: bool = False) -> torch.return_types.max:
    """torch.max(input, dim, keepdim): (values, indices), the first index of the max; NaN wins (first NaN)."""
    check_input(input, "max")
    d = normalize_dim(dim, input.dim(), "max")
    check_sizes(input.shape, "max")
    if input.dim() > 0 and input.shape[d] == 0:
        raise InvalidInputError(
            f"max: the reduced dim must be non-empty (there is no maximum of nothing), but dim {dim} of shape "
            f"{list(input.shape)} has size 0"
        )
    values, indices = _MAX.run(input, d, bool(keepdim), trains=use_custom_op(input))
    return torch.return_types.max((values, indices))
