"""tunekit.ops: fused elementwise ops (gelu, bias + activation, bias + activation + residual), one pass each.

All three run the `pointwise` kernel, y = act(input * scale + bias) + residual with fp32 math, on the best
cached config for the problem. Inputs of any leading dims are viewed as [-1, N] (N the last dim); strided inputs
are made contiguous; the result is a new contiguous tensor of input's shape and dtype. Gradients flow to input,
bias and residual: the backward recomputes the pre-activation from the saved input and bias (fp32, torch ops).

Each op is a torch custom op (`torch.ops.tunekit.<name>`), so torch.compile(fullgraph=True) traces through it;
eager calls skip the custom-op dispatch and run the implementation directly.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tunekit.core import backend
from tunekit.core.errors import InvalidInputError
from tunekit.kernels.common import TORCH_ACTIVATIONS
from tunekit.ops._checks import check_device, check_same_device, dtype_name, grads_flow, use_custom_op
from tunekit.runtime.dispatch import TORCH, dispatcher
from tunekit.runtime.hotpath import hot_path
from tunekit.search_spaces.pointwise import ACTIVATIONS

_POINTWISE = dispatcher("pointwise", torch_fallback=True)
_POINTWISE_ON_GPU = backend.torch_device().type == "cuda"
_GELU_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}


def _check_operand(t: object, x: torch.Tensor, what: str, shape: tuple[int, ...], rule: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{what} must be a tensor or None, but got {type(t).__name__}")
    if t.dtype != x.dtype:
        raise InvalidInputError(f"{what} dtype must match input dtype {x.dtype}, but got {t.dtype}")
    if tuple(t.shape) != shape:
        raise InvalidInputError(f"{what} must have shape {rule} = {list(shape)}, but got {list(t.shape)}")
    check_same_device(t, x, what)
    return t


def _validate(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str, scale: float
) -> str:
    """Refuse anything the kernel would get wrong; return input's dtype name."""
    if not isinstance(input, torch.Tensor):
        raise InvalidInputError(f"input must be a tensor, but got {type(input).__name__}")
    dtype = dtype_name(input, "input")
    check_device(input, "input")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise InvalidInputError(f"activation must be one of {list(ACTIVATIONS)}, but got {activation!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise InvalidInputError(f"scale must be a Python float, but got {type(scale).__name__}")
    if bias is not None:
        if input.dim() == 0:
            raise InvalidInputError("a bias is broadcast over the last dim, but input is 0-dim")
        _check_operand(bias, input, "bias", (input.shape[-1],), "[input.shape[-1]]")
    if residual is not None:
        _check_operand(residual, input, "residual", tuple(input.shape), "input.shape")
    return dtype


def _pointwise(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str, scale: float
) -> torch.Tensor:
    """Validate, dispatch and launch: act(input * scale + bias) + residual as a new contiguous tensor."""
    _validate(input, bias, residual, activation, scale)
    if input.numel() == 0:
        return input.new_empty(input.shape)
    n = input.shape[-1] if input.dim() > 0 else 1
    x = input.reshape(-1, n)
    if not x.is_contiguous():
        x = x.contiguous()
    b = bias.contiguous() if bias is not None else None
    r = residual.reshape(-1, n).contiguous() if residual is not None else None
    spec, inputs = _POINTWISE.spec, (x, b, r, float(scale), activation)
    config = _POINTWISE.config(spec.key_of(inputs))
    if config is TORCH:
        return _torch_pointwise(input, bias, residual, activation, scale)
    y = torch.empty_like(x)
    spec.launch(config, inputs, (y,))
    return y.view(input.shape)


def _torch_pointwise(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str, scale: float
) -> torch.Tensor:
    """The eager torch chain a user writes without tunekit (dispatch served TORCH)."""
    z = input * scale if scale != 1.0 else input
    y = TORCH_ACTIVATIONS[activation](z if bias is None else z + bias)
    return (y if residual is None else y + residual).contiguous()


def _fake(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str, scale: float
) -> torch.Tensor:
    _validate(input, bias, residual, activation, scale)
    return input.new_empty(input.shape)


def _gelu_activation(approximate: str) -> str:
    activation = _GELU_APPROXIMATE.get(approximate) if isinstance(approximate, str) else None
    if activation is None:
        raise InvalidInputError(f"approximate must be one of {list(_GELU_APPROXIMATE)}, but got {approximate!r}")
    return activation


@torch.library.custom_op("tunekit::gelu", mutates_args=())
def _gelu_op(input: torch.Tensor, approximate: str) -> torch.Tensor:
    return _pointwise(input, None, None, _gelu_activation(approximate), 1.0)


@_gelu_op.register_fake
def _gelu_fake(input: torch.Tensor, approximate: str) -> torch.Tensor:
    return _fake(input, None, None, _gelu_activation(approximate), 1.0)


@torch.library.custom_op("tunekit::bias_act", mutates_args=())
def _bias_act_op(input: torch.Tensor, bias: torch.Tensor | None, activation: str, scale: float) -> torch.Tensor:
    return _pointwise(input, bias, None, activation, scale)


@_bias_act_op.register_fake
def _bias_act_fake(input: torch.Tensor, bias: torch.Tensor | None, activation: str, scale: float) -> torch.Tensor:
    return _fake(input, bias, None, activation, scale)


@torch.library.custom_op("tunekit::bias_act_residual", mutates_args=())
def _bias_act_residual_op(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, activation: str, scale: float
) -> torch.Tensor:
    return _pointwise(input, bias, residual, activation, scale)


@_bias_act_residual_op.register_fake
def _bias_act_residual_fake(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, activation: str, scale: float
) -> torch.Tensor:
    return _fake(input, bias, residual, activation, scale)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def activation_grad(z: torch.Tensor, activation: str) -> torch.Tensor:
    """d act(z) / dz, elementwise in fp32, for every activation the pointwise and GEMM epilogues apply."""
    if activation == "none":
        return torch.ones_like(z)
    if activation == "relu":
        return (~(z <= 0)).to(z.dtype)  # as torch's threshold_backward: NaN passes the gradient through
    if activation == "gelu":
        return 0.5 * (1.0 + torch.erf(z * math.sqrt(0.5))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if activation == "gelu_tanh":
        t = torch.tanh(_SQRT_2_OVER_PI * (z + _GELU_TANH_C * z**3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * _GELU_TANH_C * z * z)
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    if activation == "sigmoid":
        s = torch.sigmoid(z)
        return s * (1.0 - s)
    if activation == "tanh":
        return 1.0 - torch.tanh(z) ** 2
    raise InvalidInputError(f"activation must be one of {list(ACTIVATIONS)}, but got {activation!r}")


def _pointwise_backward(
    grad: torch.Tensor, input: torch.Tensor, bias: torch.Tensor | None, activation: str, scale: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d input, d bias) of act(input * scale + bias)."""
    z = input.float() * scale
    if bias is not None:
        z = z + bias.float()
    dz = grad.float() * activation_grad(z, activation)
    dbias = dz.reshape(-1, dz.shape[-1]).sum(0).to(bias.dtype) if bias is not None else None
    return (dz * scale).to(input.dtype), dbias


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    input, bias, activation, scale = inputs[0], inputs[1], inputs[-2], inputs[-1]
    ctx.save_for_backward(input, bias)
    ctx.activation, ctx.scale = activation, scale


def _bias_act_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    input, bias = ctx.saved_tensors
    dinput, dbias = _pointwise_backward(grad, input, bias, ctx.activation, ctx.scale)
    return dinput, dbias, None, None


def _bias_act_residual_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    input, bias = ctx.saved_tensors
    dinput, dbias = _pointwise_backward(grad, input, bias, ctx.activation, ctx.scale)
    return dinput, dbias, grad, None, None


def _gelu_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.activation = _gelu_activation(inputs[1])


def _gelu_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (input,) = ctx.saved_tensors
    return _pointwise_backward(grad, input, None, ctx.activation, 1.0)[0], None


_bias_act_op.register_autograd(_bias_act_grad, setup_context=_setup)
_bias_act_residual_op.register_autograd(_bias_act_residual_grad, setup_context=_setup)
_gelu_op.register_autograd(_gelu_grad, setup_context=_gelu_setup)


def _torch_trains_it(*tensors: torch.Tensor | None) -> bool:
    """Eager training: torch's own chain and autograd run the call (on a GPU; the interpreter keeps the kernels).
    The registered backward recomputes in fp32 over several passes, where torch's fused backward kernels take one:
    in eager mode it is never the faster choice. Under torch.compile the custom op and its backward are traced."""
    return grads_flow(*tensors) and not torch.compiler.is_compiling() and _POINTWISE_ON_GPU


@hot_path(torch.nn.functional.gelu)
def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """torch.nn.functional.gelu: 'none' is the erf form, 'tanh' the tanh approximation (fused, one pass)."""
    activation = _gelu_activation(approximate)
    if _torch_trains_it(input):
        _validate(input, None, None, activation, 1.0)
        return _torch_pointwise(input, None, None, activation, 1.0)
    if use_custom_op(input):
        _validate(input, None, None, activation, 1.0)  # one-line errors before torch checks the op's schema
        return torch.ops.tunekit.gelu(input, approximate)
    return _pointwise(input, None, None, activation, 1.0)


def _torch_bias_act(
    input: torch.Tensor, bias: torch.Tensor | None, activation: str, *, scale: float = 1.0
) -> torch.Tensor:
    return _torch_pointwise(input, bias, None, activation, scale)


def _torch_bias_act_residual(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, activation: str, *, scale: float = 1.0
) -> torch.Tensor:
    return _torch_pointwise(input, bias, residual, activation, scale)


@hot_path(_torch_bias_act)
def bias_act(input: torch.Tensor, bias: torch.Tensor | None, activation: str, *, scale: float = 1.0) -> torch.Tensor:
    """act(input * scale + bias): bias [N] (or None) over the last dim N; activation one of ACTIVATIONS."""
    if _torch_trains_it(input, bias):
        _validate(input, bias, None, activation, scale)
        return _torch_pointwise(input, bias, None, activation, scale)
    if use_custom_op(input, bias):
        _validate(input, bias, None, activation, scale)
        return torch.ops.tunekit.bias_act(input, bias, activation, scale)
    return _pointwise(input, bias, None, activation, scale)


@hot_path(_torch_bias_act_residual)
def bias_act_residual(
    input: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    activation: str,
    *,
    scale: float = 1.0,
) -> torch.Tensor:
    """act(input * scale + bias) + residual: residual of input's shape and dtype, added after the activation."""
    if residual is None:
        raise InvalidInputError("residual must be a tensor of input's shape, but got None (use bias_act)")
    if _torch_trains_it(input, bias, residual):
        _validate(input, bias, residual, activation, scale)
        return _torch_pointwise(input, bias, residual, activation, scale)
    if use_custom_op(input, bias, residual):
        _validate(input, bias, residual, activation, scale)
        return torch.ops.tunekit.bias_act_residual(input, bias, residual, activation, scale)
    return _pointwise(input, bias, residual, activation, scale)
