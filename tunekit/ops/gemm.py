"""tunekit.ops.linear / tunekit.ops.matmul: torch's GEMM entry points with a fused epilogue, tuned Triton underneath.

    linear(input, weight, bias=None, activation=None, residual=None)
        = act(input @ weight.T + bias) + residual             (torch.nn.functional.linear's layout)
    matmul(a, b, *, bias=None, activation=None, alpha=1.0, beta=1.0, residual=None)
        = act(alpha * a @ b + bias) + beta * residual         (2-D a, b)

Row- and column-major operands (e.g. transposed views, linear's weight) go to the kernel as they are; other
strides are copied to row-major first. Forward only: no autograd formula is registered, so inputs that require grad
are refused while grad mode is on (AutogradUnsupportedError), never silently detached.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from tunekit.dispatch import dispatcher
from tunekit.errors import InvalidInputError
from tunekit.kernels.gemm import ACTIVATIONS, epilogue_reference, layout_of, tensors_aligned16
from tunekit.ops._checks import check_device, check_same_device, dtype_name, refuse_autograd
from tunekit.search_spaces.gemm import is_aligned16

__all__ = ["linear", "matmul"]

_GEMM = dispatcher("gemm")


def _check_activation(activation: str | None) -> str:
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise InvalidInputError(f"activation must be None or one of {list(ACTIVATIONS)}, but got {activation!r}")
    return activation


def _check_scalar(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{what} must be a real number, but got {type(value).__name__}")
    return float(value)


def _check_tensor(t: object, what: str, dtype: str, ref: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{what} must be a tensor, but got {type(t).__name__}")
    if dtype_name(t, what) != dtype:
        raise InvalidInputError(f"{what} dtype must match the input's {ref.dtype} (no mixed dtypes), but got {t.dtype}")
    check_same_device(t, ref, what)


def _check_epilogue_tensors(
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    out_shape: tuple[int, ...],
    dtype: str,
    ref: torch.Tensor,
) -> None:
    if bias is not None:
        _check_tensor(bias, "bias", dtype, ref)
        if tuple(bias.shape) != out_shape[-1:]:
            raise InvalidInputError(f"bias must have shape [{out_shape[-1]}] (N), but got {list(bias.shape)}")
    if residual is not None:
        _check_tensor(residual, "residual", dtype, ref)
        if tuple(residual.shape) != out_shape:
            raise InvalidInputError(
                f"residual must have the output's shape {list(out_shape)}, but got {list(residual.shape)}"
            )


def _as_kernel_operand(t: torch.Tensor) -> tuple[torch.Tensor, str]:
    layout = layout_of(t)
    if layout == "strided":
        return t.contiguous(), "row"
    return t, layout


def _gemm_2d(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    """The validated 2-D case: dispatch on the problem key and launch."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return a.new_empty((m, n))
    if k == 0:  # a @ b is all zeros (torch's semantics): only the epilogue remains
        zeros = torch.zeros((m, n), device=a.device, dtype=torch.float32)
        return epilogue_reference(zeros, bias, residual, activation, alpha, beta).to(a.dtype)
    a, a_layout = _as_kernel_operand(a)
    b, b_layout = _as_kernel_operand(b)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if residual is not None and layout_of(residual) != "row":
        residual = residual.contiguous()
    out = torch.empty((m, n), device=a.device, dtype=a.dtype)
    dtype = dtype_name(a, "a")
    # 16 bytes: leading dims and strides span multiples of 16 bytes, pointers 16-byte aligned (TMA's rules).
    aligned = is_aligned16(m, n, k, dtype, a_layout) and tensors_aligned16(a, b, out, bias, residual)
    key = (
        m,
        n,
        k,
        dtype,
        a_layout,
        b_layout,
        activation,
        bias is not None,
        residual is not None,
        aligned,
    )
    _GEMM.spec.launch(_GEMM.config(key), (a, b, bias, residual, activation, alpha, beta), (out,))
    return out


def _linear_impl(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
) -> torch.Tensor:
    k = input.shape[-1]
    out_features = weight.shape[0]
    out_shape = (*input.shape[:-1], out_features)
    m = math.prod(input.shape[:-1])  # explicit: reshape(-1, 0) is ambiguous for empty tensors
    x2d = input.reshape(m, k)
    r2d = residual.reshape(m, out_features) if residual is not None else None
    # weight [out, in] -> B = weight.T [in, out]: a column-major view, no copy.
    return _gemm_2d(x2d, weight.T, bias, r2d, activation, 1.0, 1.0).view(out_shape)


@torch.library.custom_op("tunekit::matmul", mutates_args=())
def _matmul_op(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045  (torch.library parses the annotations of this signature)
    residual: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    return _gemm_2d(a, b, bias, residual, activation, alpha, beta)


@_matmul_op.register_fake
def _matmul_fake(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("tunekit::linear", mutates_args=())
def _linear_op(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045  (torch.library parses the annotations of this signature)
    residual: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
) -> torch.Tensor:
    return _linear_impl(input, weight, bias, residual, activation)


@_linear_op.register_fake
def _linear_fake(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(alpha * a @ b + bias) + beta * residual for 2-D a [M, K], b [K, N]; bias [N], residual [M, N].

    fp32 accumulation (fp32 inputs multiply as tf32); the result has the inputs' dtype. Forward only.
    """
    if not isinstance(a, torch.Tensor):
        raise InvalidInputError(f"a must be a tensor, but got {type(a).__name__}")
    dtype = dtype_name(a, "a")
    check_device(a, "a")
    _check_tensor(b, "b", dtype, a)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise InvalidInputError(
            f"matmul needs 2-D a [M, K] and b [K, N] with matching K, but got {list(a.shape)} and {list(b.shape)}"
        )
    act = _check_activation(activation)
    alpha_f, beta_f = _check_scalar(alpha, "alpha"), _check_scalar(beta, "beta")
    _check_epilogue_tensors(bias, residual, (a.shape[0], b.shape[1]), dtype, a)
    refuse_autograd("tunekit.ops.matmul", a, b, bias, residual)
    if torch.compiler.is_compiling():
        return _matmul_op(a, b, bias, residual, act, alpha_f, beta_f)
    return _gemm_2d(a, b, bias, residual, act, alpha_f, beta_f)


def linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(input @ weight.T + bias) + residual, like torch.nn.functional.linear plus a fused epilogue.

    input [..., in_features], weight [out_features, in_features], bias [out_features], residual [..., out_features].
    Forward only.
    """
    if not isinstance(input, torch.Tensor):
        raise InvalidInputError(f"input must be a tensor, but got {type(input).__name__}")
    dtype = dtype_name(input, "input")
    check_device(input, "input")
    _check_tensor(weight, "weight", dtype, input)
    if input.dim() < 1 or weight.dim() != 2 or input.shape[-1] != weight.shape[1]:
        raise InvalidInputError(
            f"linear needs input [..., in_features] and weight [out_features, in_features], but got "
            f"{list(input.shape)} and {list(weight.shape)}"
        )
    act = _check_activation(activation)
    out_shape = (*input.shape[:-1], weight.shape[0])
    _check_epilogue_tensors(bias, residual, out_shape, dtype, input)
    refuse_autograd("tunekit.ops.linear", input, weight, bias, residual)
    if torch.compiler.is_compiling():
        return _linear_op(input, weight, bias, residual, act)
    return _linear_impl(input, weight, bias, residual, act)
