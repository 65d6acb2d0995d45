"""tunekit.ops.layer_norm: torch.nn.functional.layer_norm's signature, tuned Triton kernel underneath."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tunekit.dispatch import dispatcher
from tunekit.errors import InvalidInputError
from tunekit.ops._checks import check_device, check_same_device, dtype_name
from tunekit.spec import row_bucket

_LAYERNORM = dispatcher("layernorm")


def _check_affine(p: torch.Tensor | None, shape: tuple[int, ...], x: torch.Tensor, what: str) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise InvalidInputError(f"{what} must be a tensor or None, but got {type(p).__name__}")
    if tuple(p.shape) != shape:
        raise InvalidInputError(f"{what} must have shape normalized_shape={list(shape)}, but got {list(p.shape)}")
    dtype_name(p, what)
    check_same_device(p, x, what)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the trailing `normalized_shape` dims, with fp32 statistics. Same contract as torch's."""
    if not isinstance(input, torch.Tensor):
        raise InvalidInputError(f"input must be a tensor, but got {type(input).__name__}")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(input.shape[input.dim() - len(shape) :]) != shape or input.dim() < len(shape):
        raise InvalidInputError(
            f"normalized_shape={list(shape)} must match the trailing dims of input of shape {list(input.shape)}"
        )
    dtype = dtype_name(input, "input")
    check_device(input, "input")
    _check_affine(weight, shape, input, "weight")
    _check_affine(bias, shape, input, "bias")
    n = math.prod(shape)
    if input.numel() == 0:
        return torch.empty_like(input)
    x2d = input.reshape(-1, n)
    if not x2d.is_contiguous():
        x2d = x2d.contiguous()
    w = weight.reshape(n).contiguous() if weight is not None else None
    b = bias.reshape(n).contiguous() if bias is not None else None
    key = (row_bucket(x2d.shape[0]), n, dtype, w is not None, b is not None)
    config = _LAYERNORM.config(key)
    y2d = torch.empty_like(x2d)
    _LAYERNORM.spec.launch(config, (x2d, w, b, float(eps)), (y2d,))
    return y2d.view(input.shape)
