"""tunekit.ops.linear / tunekit.ops.matmul: torch's GEMM entry points with a fused epilogue, tuned Triton underneath.

    linear(input, weight, bias=None, activation=None, residual=None)
        = act(input @ weight.T + bias) + residual             (torch.nn.functional.linear's layout)
    matmul(a, b, *, bias=None, activation=None, alpha=1.0, beta=1.0, residual=None)
        = act(alpha * a @ b + bias) + beta * residual         (2-D a, b)

Row- and column-major operands (e.g. transposed views, linear's weight) go to the kernel as they are; other
strides are copied to row-major first.

Gradients: when they flow, the GEMM (bias fused) runs as its own op with a backward, and the activation and
residual as torch's ops (autograd saves the pre-activation, as eager torch does). dA = alpha * dY @ B^T and
dB = alpha * A^T @ dY are GEMM problems of this library (transposed layouts, keyed, tuned and cached like any
problem), each computed in its operand's layout (a column-major B such as linear's weight.T gets (dY^T A)^T, so
its gradient needs no copy); d bias is a column sum; d residual is beta * dY. Where dispatch serves torch for the
forward GEMM or either backward GEMM (untuned problems, on a GPU), torch's own ops and autograd run the whole call.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F

from tunekit.core.errors import InvalidInputError, TunekitError
from tunekit.core.spec import DTYPE_NAMES
from tunekit.kernels.common import TORCH_ACTIVATIONS
from tunekit.kernels.gemm import ACTIVATIONS, SPEC, epilogue_reference, layout_of, torch_gemm
from tunekit.ops._checks import check_device, check_same_device, dtype_name, grads_flow, use_custom_op
from tunekit.ops._launch import dispatch_launch
from tunekit.ops.declaration import SELF, Autograd, OpDeclaration, Screen, declare, public_op
from tunekit.runtime import compiled_gemm
from tunekit.runtime.dispatch import TORCH, dispatcher

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


def _as_kernel_operand(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous() if layout_of(t) == "strided" else t


class _Gemm(NamedTuple):
    """One GEMM problem as the kernel takes it (the spec's inputs): act(alpha * a @ b + bias) + beta * residual for
    2-D a [M, K] and b [K, N]. The fields and defaults are matmul's keywords."""

    a: torch.Tensor
    b: torch.Tensor
    bias: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    activation: str = "none"
    alpha: float = 1.0
    beta: float = 1.0


def _gemm_2d(g: _Gemm) -> torch.Tensor:
    """The validated 2-D case: dispatch on the problem key and launch."""
    a, b, bias, residual, activation, alpha, beta = g
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return a.new_empty((m, n))
    if k == 0:  # a @ b is all zeros (torch's semantics): only the epilogue remains
        zeros = torch.zeros((m, n), device=a.device, dtype=torch.float32)
        return epilogue_reference(zeros, bias, residual, activation, alpha, beta).to(a.dtype)
    a = _as_kernel_operand(a)
    b = _as_kernel_operand(b)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if residual is not None and layout_of(residual) != "row":
        residual = residual.contiguous()
    out = torch.empty((m, n), device=a.device, dtype=a.dtype)
    g = _Gemm(a, b, bias, residual, activation, alpha, beta)
    return out if dispatch_launch(_GEMM, g, (out,)) else torch_gemm(g)


def _grad_products(
    a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor
) -> tuple[tuple[torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor, bool]]:
    """The backward GEMMs dA = dY Bᵀ and dB = Aᵀ dY as (x, y, transposed): the gradient is x @ y, or (x @ y)ᵀ
    where transposed. A column-major operand (linear's weight.T) gets its gradient as the transpose of a row-major
    product, so it lands in that operand's own layout: autograd then accumulates it into the parameter with no
    layout copy (a row-major dB under weight.T cost a full strided copy of every weight gradient, as torch's own mm
    backward avoids the same way)."""
    da = (b, dy.T, True) if layout_of(a) == "col" else (dy, b.T, False)
    db = (dy.T, a, True) if layout_of(b) == "col" else (a.T, dy, False)
    return da, db


def _torch_trains_it(g: _Gemm) -> bool:
    """Eager training where dispatch serves torch for the forward GEMM or either backward GEMM (dA = dY B^T,
    dB = A^T dY): then torch's own ops with torch's autograd run the whole call, as they would without tunekit."""
    a, b = g.a, g.b
    if torch.compiler.is_compiling() or a.numel() == 0 or b.numel() == 0:
        return False
    if "strided" in (layout_of(a), layout_of(b)):
        return True
    # The incoming gradient, as key_of sees it (a fresh row-major tensor), without allocating one. The key reads
    # neither alpha nor beta.
    dy = torch.empty((a.shape[0], b.shape[1]), device="meta", dtype=a.dtype)
    problems = (g, *(_Gemm(x, y) for x, y, _ in _grad_products(a, b, dy)))
    # All three resolved (no short cut): a recording then holds the backward problems even where torch serves the
    # forward one, so `tune --plan` tunes them.
    served = [_GEMM.config(_GEMM.spec.key_of(p)) for p in problems]
    return any(config is TORCH for config in served)


def _linear_gemm(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, act: str
) -> _Gemm:
    """linear's call as the 2-D GEMM: input [..., K] as A [M, K]; weight [N, K] as B = weight.T [K, N], a
    column-major view (no copy); residual [..., N] as [M, N]."""
    m, n = math.prod(input.shape[:-1]), weight.shape[0]  # explicit: reshape(-1, 0) is ambiguous for empty tensors
    x2d = input.reshape(m, input.shape[-1])
    r2d = residual.reshape(m, n) if residual is not None else None
    return _Gemm(x2d, weight.T, bias, r2d, act)


def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045  (torch.library parses the annotations of this signature)
    residual: Optional[torch.Tensor],  # noqa: UP045
    activation: str,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    return _gemm_2d(_Gemm(a, b, bias, residual, activation, alpha, beta))


def _matmul_fake(a: torch.Tensor, b: torch.Tensor, *epilogue: object) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _matmul_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, _, _, activation, alpha, beta = inputs
    ctx.save_for_backward(a, b)
    ctx.activation, ctx.alpha, ctx.beta = activation, alpha, beta


def _matmul_grad(matmul: Callable[..., torch.Tensor]) -> Callable[..., tuple[Any, ...]]:
    """The backward formula; dA = dY B^T and dB = A^T dY run through `matmul` (the custom op, or its body)."""

    def grad_of(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if ctx.activation != "none":  # _gemm_op splits the activation off whenever gradients flow
            raise TunekitError("tunekit::matmul with a fused activation has no backward; call tunekit.ops.matmul")
        a, b = ctx.saved_tensors
        need_a, need_b, need_bias, need_residual = ctx.needs_input_grad[:4]

        def product(x: torch.Tensor, y: torch.Tensor, transposed: bool) -> torch.Tensor:
            out = matmul(x, y, None, None, "none", ctx.alpha, 1.0)
            return out.T if transposed else out

        grad_a, grad_b = _grad_products(a, b, grad)
        da = product(*grad_a) if need_a else None
        db = product(*grad_b) if need_b else None
        dbias = grad.sum(0) if need_bias else None
        dresidual = (grad if ctx.beta == 1.0 else grad * ctx.beta) if need_residual else None
        return da, db, dbias, dresidual, None, None, None

    return grad_of


# The gradients are GEMMs (dA = dY B^T, dB = A^T dY) through the op itself; eagerly they replay as plans.
_MATMUL = declare(OpDeclaration("matmul", _matmul, _matmul_fake, Autograd(_matmul_setup, _matmul_grad, SELF)))


def _gemm_op(g: _Gemm) -> torch.Tensor:
    """The autograd path: the custom op under torch.compile, its eager Function otherwise. With gradients and an
    activation: GEMM, then pointwise."""
    a, b, bias, residual, activation, alpha, beta = g
    matmul = functools.partial(_MATMUL.run, trains=True)
    if activation == "none" or not grads_flow(a, b, bias, residual):
        return matmul(a, b, bias, residual, activation, alpha, beta)
    z = matmul(a, b, bias, None, "none", alpha, 1.0)
    y = TORCH_ACTIVATIONS[activation](z)  # torch's ops: their fused backward, or inductor's fusion
    return y if residual is None else y.add(residual, alpha=beta)


def _torch_matmul(a: torch.Tensor, b: torch.Tensor, *, activation: str | None = None, **epilogue: Any) -> torch.Tensor:
    """matmul where dispatch served TORCH (a replayed call: matmul has validated its arguments). A projection's
    call (GPT-2's Conv1D: a bias at most) is torch_gemm's one cuBLAS call, made without its epilogue's steps."""
    if activation is None and epilogue.keys() <= _BIAS_ONLY:
        bias = epilogue.get("bias")
        return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
    return torch_gemm(_Gemm(a, b, activation=_check_activation(activation), **epilogue))


_BIAS_ONLY = frozenset({"bias"})


def _torch_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """linear where dispatch served TORCH: torch's ops as a user writes them (F.linear, the activation, the
    residual add), so a training call records torch's own graph and nothing more. F.linear folds an N-D input
    into the same cuBLAS addmm the 2-D path calls, so a replayed call gives the full path's bits."""
    product = F.linear(input, weight, bias)
    if activation is None and residual is None:  # nn.Linear's call: nothing more (the hot path's commonest call)
        return product
    return _epilogue(product, activation, residual)


def _compiled_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """linear traced by torch.compile as torch's code: its GEMM takes the Inductor choice stored for its problem,
    where one is (compiled_gemm), else F.linear."""
    product = compiled_gemm.linear(input, weight, bias)
    return _epilogue(F.linear(input, weight, bias) if product is None else product, activation, residual)


def _epilogue(product: torch.Tensor, activation: str | None, residual: torch.Tensor | None) -> torch.Tensor:
    y = TORCH_ACTIVATIONS[_check_activation(activation)](product)
    return y if residual is None else y + residual


# A GEMM entry serves its own m and, at a bucket edge, the token counts below it down to the edge before
# (tunekit.runtime.buckets): the screen compares m by the edge at or above it, n, k and dtype exactly.
_TOKENS = SPEC.token_buckets
assert _TOKENS is not None
_m_ceiling = _TOKENS.ceiling
_GEMM_FIELDS = ("m", "n", "k", "dtype")
_COARSENED = (("m", _m_ceiling),)


def _matmul_problem(a: torch.Tensor, b: torch.Tensor, **_: object) -> tuple[int, int, int, str] | None:
    if a.dim() != 2 or b.dim() != 2:
        return None
    return (_m_ceiling(a.shape[0]), b.shape[1], b.shape[0], DTYPE_NAMES[a.dtype])


def _linear_problem(
    input: torch.Tensor, weight: torch.Tensor, *_: object, **__: object
) -> tuple[int, int, int, str] | None:
    # weight is [out_features, in_features]: b = weight.T is [K, N]; the input's leading dims fold into m
    if weight.dim() != 2 or input.dim() == 0 or not weight.shape[1]:
        return None
    n, k = weight.shape
    return (_m_ceiling(input.numel() // k), n, k, DTYPE_NAMES[input.dtype])


@public_op(_torch_matmul, _GEMM, runs=_MATMUL, screen=Screen(_matmul_problem, _GEMM_FIELDS, coarsened=_COARSENED))
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

    fp32 accumulation (fp32 inputs multiply as tf32); the result has the inputs' dtype.
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
    g = _Gemm(a, b, bias, residual, act, alpha_f, beta_f)
    if grads_flow(a, b, bias, residual) and _torch_trains_it(g):
        return torch_gemm(g)
    if use_custom_op(a, b, bias, residual):
        return _gemm_op(g)
    return _gemm_2d(g)


@public_op(
    _torch_linear,
    _GEMM,
    runs=_MATMUL,
    screen=Screen(_linear_problem, _GEMM_FIELDS, coarsened=_COARSENED),
    compiled_fallback=_compiled_linear,
)
def linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(input @ weight.T + bias) + residual, like torch.nn.functional.linear plus a fused epilogue.

    input [..., in_features], weight [out_features, in_features], bias [out_features], residual [..., out_features].
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
    g = _linear_gemm(input, weight, bias, residual, act)
    if not use_custom_op(input, weight, bias, residual):
        return _gemm_2d(g).view(out_shape)
    if grads_flow(input, weight, bias, residual) and _torch_trains_it(g):
        return _torch_linear(input, weight, bias, act, residual)
    return _gemm_op(g).view(out_shape)
