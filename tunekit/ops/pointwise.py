"""tunekit.ops: fused elementwise ops (gelu, bias + activation, bias + activation + residual), one pass each.

All three run the `pointwise` kernel, y = act(input * scale + bias) + residual with fp32 math, on the best
cached config for the problem. Inputs of any leading dims are viewed as [-1, N] (N the last dim); strided inputs
are made contiguous; the result is a new contiguous tensor of input's shape and dtype. Forward only: inputs that
require grad are refused while grad mode is on (there is no backward).

Each op is a torch custom op (`torch.ops.tunekit.<name>`), so torch.compile(fullgraph=True) traces through it;
eager calls skip the custom-op dispatch and run the implementation directly.
"""

from __future__ import annotations

import torch

from tunekit.dispatch import dispatcher
from tunekit.errors import InvalidInputError
from tunekit.ops._checks import check_device, check_same_device, dtype_name, refuse_autograd
from tunekit.search_spaces.pointwise import ACTIVATIONS
from tunekit.spec import row_bucket

_POINTWISE = dispatcher("pointwise")
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
    refuse_autograd("tunekit's pointwise ops (gelu, bias_act, bias_act_residual)", input, bias, residual)
    return dtype


def _pointwise(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str, scale: float
) -> torch.Tensor:
    """Validate, dispatch and launch: act(input * scale + bias) + residual as a new contiguous tensor."""
    dtype = _validate(input, bias, residual, activation, scale)
    if input.numel() == 0:
        return input.new_empty(input.shape)
    n = input.shape[-1] if input.dim() > 0 else 1
    x = input.reshape(-1, n)
    if not x.is_contiguous():
        x = x.contiguous()
    b = bias.contiguous() if bias is not None else None
    r = residual.reshape(-1, n).contiguous() if residual is not None else None
    cols = n if b is not None else 0  # without a bias the kernel streams x flat: the last dim does not matter
    key = (row_bucket(x.numel()), cols, cols % 16 == 0, dtype, activation, b is not None, r is not None)
    config = _POINTWISE.config(key)
    y = torch.empty_like(x)
    _POINTWISE.spec.launch(config, (x, b, r, float(scale), activation), (y,))
    return y.view(input.shape)


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


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """torch.nn.functional.gelu: 'none' is the erf form, 'tanh' the tanh approximation (fused, one pass)."""
    if torch.compiler.is_compiling():
        return torch.ops.tunekit.gelu(input, approximate)
    return _pointwise(input, None, None, _gelu_activation(approximate), 1.0)


def bias_act(input: torch.Tensor, bias: torch.Tensor | None, activation: str, *, scale: float = 1.0) -> torch.Tensor:
    """act(input * scale + bias): bias [N] (or None) over the last dim N; activation one of ACTIVATIONS."""
    if torch.compiler.is_compiling():
        return torch.ops.tunekit.bias_act(input, bias, activation, scale)
    return _pointwise(input, bias, None, activation, scale)


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
    if torch.compiler.is_compiling():
        return torch.ops.tunekit.bias_act_residual(input, bias, residual, activation, scale)
    return _pointwise(input, bias, residual, activation, scale)
