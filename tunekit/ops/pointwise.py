"""tunekit.ops: fused elementwise ops (gelu, bias + activation, bias + activation + residual), one pass each.

All three run the `pointwise` kernel, y = act(input * scale + bias) + residual with fp32 math, on the best
cached config for the problem. Inputs of any leading dims are viewed as [-1, N] (N the last dim); strided inputs
are made contiguous; the result is a new contiguous tensor of input's shape and dtype. Gradients flow to input,
bias and residual: the backward recomputes the pre-activation from the saved input and bias in the
`pointwise_backward` kernel, d input and d bias in one pass (torch custom op `tunekit::pointwise_backward`); d
residual is the incoming gradient. Gradients of bias and input are computed only where needed. Double backward is
not supported.

Each op is a torch custom op (`torch.ops.tunekit.<name>`), so torch.compile(fullgraph=True) traces through it;
eager calls skip the custom-op dispatch and run the implementation directly. Eager calls whose gradients flow
skip it too: a torch.autograd.Function (tunekit/runtime/eager_autograd.py) runs the same forward, setup and
backward formula. Where dispatch serves torch for the backward problem (by default, a problem untuned on a GPU),
eager training runs torch's own chain and autograd, as without tunekit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES, row_bucket
from tunekit.kernels.common import TORCH_ACTIVATIONS
from tunekit.ops._checks import check_device, check_same_device, dtype_name, grads_flow, use_custom_op
from tunekit.ops._launch import dispatch_launch, launch_on_their_device, served_config, torch_trains_it
from tunekit.ops.declaration import Autograd, OpDeclaration, Screen, declare, public_op
from tunekit.runtime.dispatch import TORCH, dispatcher
from tunekit.search_spaces.pointwise.pointwise import ACTIVATIONS

_POINTWISE = dispatcher("pointwise")
_POINTWISE_BACKWARD = dispatcher("pointwise_backward")
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
    config = served_config(_POINTWISE, inputs)
    if config is TORCH:
        return _torch_pointwise(input, bias, residual, activation, scale)
    y = torch.empty_like(x)
    launch_on_their_device(spec, config, inputs, (y,))
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


_Body = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None, str, float], torch.Tensor]
_EntryPoint = Callable[..., torch.Tensor]


def _entry_points(body: _Body) -> tuple[_EntryPoint, _EntryPoint, _EntryPoint]:
    """(gelu, bias_act, bias_act_residual) over `body`, the launch or its fake: each op's signature (its custom op's
    schema) written once, with the operands it fixes."""

    def gelu(input: torch.Tensor, approximate: str) -> torch.Tensor:
        return body(input, None, None, _gelu_activation(approximate), 1.0)

    def bias_act(input: torch.Tensor, bias: torch.Tensor | None, activation: str, scale: float) -> torch.Tensor:
        return body(input, bias, None, activation, scale)

    def bias_act_residual(
        input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, activation: str, scale: float
    ) -> torch.Tensor:
        return body(input, bias, residual, activation, scale)

    return gelu, bias_act, bias_act_residual


_gelu, _bias_act, _bias_act_residual = _entry_points(_pointwise)
_gelu_fake, _bias_act_fake, _bias_act_residual_fake = _entry_points(_fake)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def activation_grad(z: torch.Tensor, activation: str, grad: torch.Tensor | None = None) -> torch.Tensor:
    """d act(z) / dz, elementwise in fp32, for every activation the pointwise and GEMM epilogues apply. Given the
    upstream `grad`: grad * d act(z) / dz as torch's backward computes it, which for relu is torch's
    threshold_backward, grad where z > 0 or z is NaN and 0 elsewhere, even where grad is NaN or inf (a product
    would give NaN there); the pointwise_backward kernel computes the same."""
    if grad is not None:
        return torch.where(z <= 0, 0.0, grad) if activation == "relu" else grad * activation_grad(z, activation)
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


def _grad_buffers(
    input: torch.Tensor, bias: torch.Tensor | None, want_dbias: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's d input, and its d bias where wanted, else an empty [0] tensor (a custom op returns no None)."""
    dx = input.new_empty(input.shape)
    return dx, bias.new_empty(bias.shape) if want_dbias and bias is not None else input.new_empty(0)


def _pointwise_backward(
    grad: torch.Tensor, input: torch.Tensor, bias: torch.Tensor | None, activation: str, scale: float, want_dbias: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d input, d bias) of act(input * scale + bias): the pointwise_backward kernel, one pass; where dispatch
    serves torch, torch ops in fp32. d bias is an empty [0] tensor unless wanted (and a bias given)."""
    want_db = want_dbias and bias is not None
    dx, db = _grad_buffers(input, bias, want_db)
    if input.numel() == 0:  # d bias is a sum over no rows
        return dx, db.zero_()
    x, dy = input.contiguous(), grad.contiguous()  # the kernel's operands; copies only where strided
    b = bias.contiguous() if bias is not None else None
    outputs = (dx, db) if want_db else (dx,)
    if dispatch_launch(_POINTWISE_BACKWARD, (x, dy, b, want_db, activation, float(scale)), outputs):
        return dx, db
    # torch ops in fp32, as the kernel computes (eager training runs torch's own chain instead)
    z = x.float() * scale
    if b is not None:
        z = z + b.float()
    dz = activation_grad(z, activation, dy.float())
    dx.copy_(dz * scale)
    if want_db:
        db.copy_(dz.reshape(-1, dz.shape[-1]).sum(0))
    return dx, db


def _pointwise_backward_fake(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    _, input, bias, _, _, want_dbias = args  # the op's arguments
    return _grad_buffers(input, bias, want_dbias)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    """bias_act's and bias_act_residual's: (input, bias, [residual,] activation, scale)."""
    input, bias, activation, scale = inputs[0], inputs[1], inputs[-2], inputs[-1]
    ctx.save_for_backward(input, bias)
    ctx.activation, ctx.scale, ctx.residual = activation, scale, len(inputs) == 5


def _gelu_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0], None)
    ctx.activation, ctx.scale, ctx.residual = _gelu_activation(inputs[1]), 1.0, False


def _pointwise_grad(backward: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Callable[..., tuple[Any, ...]]:
    """The three ops' backward formula, running the backward problem through `backward` (the custom op, or its
    body): d input and d bias in one call; d residual (bias_act_residual's third argument) is grad itself."""

    def grad_of(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        input, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        want_db = bias is not None and need[1]
        dx: torch.Tensor | None = None
        db: torch.Tensor | None = None
        if need[0] or want_db:
            dx, db = backward(grad, input, bias, ctx.activation, float(ctx.scale), want_db)
        d_residual = (grad if need[2] else None,) if ctx.residual else ()
        grads = (dx if need[0] else None, db if want_db else None, *d_residual)
        return grads + (None,) * (len(need) - len(grads))

    return grad_of


# The three ops share one backward problem (d input, d bias), its own op.
_BACKWARD = declare(OpDeclaration("pointwise_backward", _pointwise_backward, _pointwise_backward_fake))
_GELU = declare(OpDeclaration("gelu", _gelu, _gelu_fake, Autograd(_gelu_setup, _pointwise_grad, _BACKWARD)))
_BIAS_ACT = declare(OpDeclaration("bias_act", _bias_act, _bias_act_fake, Autograd(_setup, _pointwise_grad, _BACKWARD)))
_BIAS_ACT_RESIDUAL = declare(
    OpDeclaration(
        "bias_act_residual", _bias_act_residual, _bias_act_residual_fake, Autograd(_setup, _pointwise_grad, _BACKWARD)
    )
)


def _torch_trains_it(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str
) -> bool:
    """Eager training whose backward problem dispatch serves with torch (by default, one untuned on a GPU): then
    torch's own chain and its autograd run the call, its fused backward kernels one pass each, where tunekit's
    torch-served backward recomputes in fp32 over several. Under torch.compile the custom ops are traced."""
    backward = (input, input, bias, True, activation, 1.0)
    forward = lambda: (_POINTWISE, (input, bias, residual, 1.0, activation))  # noqa: E731  (key_of: shapes, dtype)
    return torch_trains_it(_POINTWISE_BACKWARD, backward, input, bias, residual, forward=forward)


def _torch_gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu where dispatch served TORCH, with gelu's signature (F.gelu takes approximate by keyword only)."""
    return torch.nn.functional.gelu(input, approximate=approximate)


def _bucketed_numel(input: torch.Tensor, *_: object, **__: object) -> tuple[int, str]:
    return row_bucket(input.numel()), DTYPE_NAMES[input.dtype]


# the kernel's problem holds the element count bucketed
_POINTWISE_SCREEN = Screen(_bucketed_numel, ("numel", "dtype"))


@public_op(_torch_gelu, _POINTWISE, _POINTWISE_BACKWARD, runs=_GELU, screen=_POINTWISE_SCREEN)
def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """torch.nn.functional.gelu: 'none' is the erf form, 'tanh' the tanh approximation (fused, one pass)."""
    activation = _gelu_activation(approximate)
    if use_custom_op(input):
        _validate(input, None, None, activation, 1.0)  # one-line errors before torch checks the op's schema
        if _torch_trains_it(input, None, None, activation):
            return _torch_pointwise(input, None, None, activation, 1.0)
    return _GELU.run(input, approximate, trains=grads_flow(input))


def _torch_bias_act(
    input: torch.Tensor, bias: torch.Tensor | None, activation: str, *, scale: float = 1.0
) -> torch.Tensor:
    return _torch_pointwise(input, bias, None, activation, scale)


def _torch_bias_act_residual(
    input: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, activation: str, *, scale: float = 1.0
) -> torch.Tensor:
    return _torch_pointwise(input, bias, residual, activation, scale)


@public_op(_torch_bias_act, _POINTWISE, _POINTWISE_BACKWARD, runs=_BIAS_ACT, screen=_POINTWISE_SCREEN)
def bias_act(input: torch.Tensor, bias: torch.Tensor | None, activation: str, *, scale: float = 1.0) -> torch.Tensor:
    """act(input * scale + bias): bias [N] (or None) over the last dim N; activation one of ACTIVATIONS."""
    if use_custom_op(input, bias):
        _validate(input, bias, None, activation, scale)
        if _torch_trains_it(input, bias, None, activation):
            return _torch_pointwise(input, bias, None, activation, scale)
    return _BIAS_ACT.run(input, bias, activation, scale, trains=grads_flow(input, bias))


@public_op(_torch_bias_act_residual, _POINTWISE, _POINTWISE_BACKWARD, runs=_BIAS_ACT_RESIDUAL, screen=_POINTWISE_SCREEN)
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
    if use_custom_op(input, bias, residual):
        _validate(input, bias, residual, activation, scale)
        if _torch_trains_it(input, bias, residual, activation):
            return _torch_pointwise(input, bias, residual, activation, scale)
    return _BIAS_ACT_RESIDUAL.run(input, bias, residual, activation, scale, trains=grads_flow(input, bias, residual))
