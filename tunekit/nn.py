"""Drop-in modules: torch's LayerNorm, RMSNorm and Linear, running tunekit's kernels.

Each subclasses torch's module, so constructors, parameters and state_dict keys are torch's and weights load
unchanged. A call tunekit cannot take (a dtype or device its kernels do not run, mixed dtypes as under autocast,
runs torch's own forward: swapping a module in never breaks a model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tunekit import ops
from tunekit.core import backend
from tunekit.core.spec import DTYPE_NAMES
from tunekit.kernels.common import TORCH_ACTIVATIONS
from tunekit.runtime import hotpath
from tunekit.runtime.hotpath import traces_as_model_code
from tunekit.search_spaces.gemm.gemm import ACTIVATIONS as GEMM_ACTIVATIONS

__all__ = ["LayerNorm", "Linear", "RMSNorm"]

_DEVICE_TYPE = backend.torch_device().type
_ON_GPU = _DEVICE_TYPE == "cuda"

# Activations the GEMM epilogue fuses, with torch's own form for calls that fall back.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    name: TORCH_ACTIVATIONS[name] for name in GEMM_ACTIVATIONS if name != "none"
}


def apply_activation(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    return x if activation is None else ACTIVATIONS[activation](x)


def runs_here(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether tunekit's kernels take this call: a supported dtype on the kernels' device, parameters alike, and
    no autocast (which would run torch's op in another dtype than the inputs'). Read through the tensors' flags
    and device indices: a patched module asks on every call, and torch.device objects cost more to build."""
    if x.dtype not in DTYPE_NAMES or not _on_kernels_device(x) or torch.is_autocast_enabled(_DEVICE_TYPE):
        return False
    dtype, index = x.dtype, x.get_device()
    for p in params:
        if p is not None and (p.dtype != dtype or not _on_kernels_device(p) or p.get_device() != index):
            return False
    return True


def _on_kernels_device(t: torch.Tensor) -> bool:
    # is_cuda, which Dynamo folds to a constant; the interpreter's device by its type (is_cpu would trace as a node)
    return t.is_cuda if _ON_GPU else t.device.type == "cpu"


def param(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """A module's own parameter (or buffer) by name, typed: None when absent."""
    found = module._parameters.get(name)
    return found if found is not None else module._buffers.get(name)


def _attribute(module: torch.nn.Module, name: str) -> Any:
    """module.<name>, read from its parameters where it is one: nn.Module's __getattr__ costs a patched call more
    than the rest of its gate. A parametrized one (torch.nn.utils.parametrize) is a property, read as such."""
    params = module._parameters
    if name in params:
        return params[name]
    return getattr(module, name)


# ---------------------------------------------------------------------------------------------- the torch shortcut

TORCH_CALL = "_tunekit_torch_call"  # on a patched module: the key of its calls whose op served torch's own op
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def call_key(*tensors: torch.Tensor | None) -> tuple[object, ...] | None:
    """What decides whether a call on these tensors reaches torch's own op through an op's hot path, with its
    module's or function's checks: the hot path's epoch and each tensor's shape, dtype and device. None where a
    call must take its full path: compiling, a recording or watched call, autocast, gradients flowing. (Autocast on
    the kernels' device only: a call on another device never reached an op, so its key matches no kept one.)"""
    if _is_compiling() or hotpath.diverted() or torch.is_autocast_enabled(_DEVICE_TYPE):
        return None
    if _grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return None
    return (hotpath.EPOCH, *[None if t is None else (t.shape, t.dtype, t.device) for t in tensors])


def torch_call_key(module: torch.nn.Module, x: torch.Tensor) -> tuple[object, ...] | None:
    """call_key of a module's call: its input, weight and bias (None for a weight that is no parameter)."""
    params = module._parameters
    weight = params.get("weight")
    return None if weight is None else call_key(x, weight, params.get("bias"))


def with_torch_shortcut(
    forward: Callable[..., Any], by_torch: Callable[[Any, torch.Tensor], Any], op: str
) -> Callable[..., Any]:
    """A patched module's forward: `forward(module, x)`, except that a call of the key (torch_call_key) whose
    last call op `op` served torch's own op directly is `by_torch(module, x)`, that torch call, at once. The
    module's checks (its guard, runs_here) and the op's (the screen) read nothing the key does not hold, and a
    decode step repeats its calls' keys, so a repeated call costs the key's reads rather than every check. A
    module whose last call was served otherwise reads no key. Whether the call went to torch's op is read on the
    op's counters: threads calling one op at once may keep a key a kernel served, which torch then serves (the
    same result, maybe slower), until the next reset."""
    hot = hotpath.op_named(op)

    def call(module: torch.nn.Module, x: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling() or args or kwargs or not isinstance(x, torch.Tensor):
            return forward(module, x, *args, **kwargs)
        last = module.__dict__.get(TORCH_CALL)
        if last is not None and torch_call_key(module, x) == last:
            hot.stats.torch_direct += 1
            return by_torch(module, x)
        before = hot.stats.torch_direct
        out = forward(module, x)
        if hot.stats.torch_direct == before + 1:  # this call's op call, and only it, went to torch's op
            module.__dict__[TORCH_CALL] = torch_call_key(module, x)  # None where no shortcut may be taken
        elif last is not None:
            del module.__dict__[TORCH_CALL]
        return out

    return call


@functools.cache
def torch_call_of(op: str) -> Callable[..., Any]:
    """What op `op`'s hot path calls where it serves torch's own op."""
    torch_call = hotpath.op_named(op).torch_equivalent
    assert torch_call is not None
    return torch_call


# ---------------------------------------------------------------------------------------------- forwards


def layer_norm_forward(module: torch.nn.LayerNorm, input: torch.Tensor) -> torch.Tensor:
    shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
    if runs_here(input, weight, bias):
        return ops.layer_norm(input, shape, weight, bias, eps)
    return F.layer_norm(input, shape, weight, bias, eps)


def layer_norm_by_torch(module: torch.nn.LayerNorm, input: torch.Tensor) -> torch.Tensor:
    weight, bias = _attribute(module, "weight"), _attribute(module, "bias")
    return torch_call_of("layer_norm")(input, module.normalized_shape, weight, bias, module.eps)


def rms_norm_forward(module: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    shape, weight, eps = tuple(module.normalized_shape), module.weight, module.eps
    if runs_here(x, weight):
        return ops.rms_norm(x, shape, weight, eps)
    return F.rms_norm(x, shape, weight, eps)


def rms_norm_by_torch(module: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return torch_call_of("rms_norm")(x, tuple(module.normalized_shape), _attribute(module, "weight"), module.eps)


SWAPPED_FROM = "_tunekit_swapped_from"  # on a class tunekit.patch derived for a swap: the class it derives from


def own_forward(module: torch.nn.Module) -> Callable[..., Any]:
    """The forward of the module's own class (the one tunekit.patch derived the module's class from, if it did)."""
    cls = type(module)
    return getattr(cls, SWAPPED_FROM, cls).forward


def norm_op(statistics: str) -> str:
    """The op a found norm runs: "rms" statistics (RMSNorm's) or "layer" (LayerNorm's)."""
    return "rms_norm" if statistics == "rms" else "layer_norm"


def found_norm_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A norm of model code that tunekit.patch found to compute normalize(x) * (weight + offset) (+ bias) over the
    last dim; `_tunekit_norm` holds ("rms" or "layer", eps, offset). Calls the kernels cannot take run the
    module's own forward (its exact dtype rules, e.g. an fp32 weight on a bf16 input)."""
    weight, bias = param(module, "weight"), param(module, "bias")
    assert weight is not None  # patch only marks modules with a weight
    op = norm_op(module.__dict__["_tunekit_norm"][0])
    if traces_as_model_code(op) or not runs_here(x, weight, bias):
        return own_forward(module)(module, x)
    return getattr(ops, op)(x, *_found_norm_args(module, weight, bias))


def found_norm_by_torch(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight, bias = param(module, "weight"), param(module, "bias")
    assert weight is not None
    op = norm_op(module.__dict__["_tunekit_norm"][0])
    return torch_call_of(op)(x, *_found_norm_args(module, weight, bias))


def _found_norm_args(module: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[object, ...]:
    """A found norm's op arguments after the input."""
    statistics, eps, offset = module.__dict__["_tunekit_norm"]
    scale = weight if offset == 0 else weight + offset  # Gemma's (1 + weight): a new tensor, autograd flows
    return (tuple(weight.shape), scale, eps) if statistics == "rms" else (tuple(weight.shape), scale, bias, eps)


class LayerNorm(torch.nn.LayerNorm):
    forward = with_torch_shortcut(layer_norm_forward, layer_norm_by_torch, "layer_norm")


class RMSNorm(torch.nn.RMSNorm):
    forward = with_torch_shortcut(rms_norm_forward, rms_norm_by_torch, "rms_norm")


class Linear(torch.nn.Linear):
    """torch.nn.Linear with an optional fused activation, and an optional residual added after it."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        activation: str | None = None,
    ) -> None:
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"activation must be None or one of {sorted(ACTIVATIONS)}, but got {activation!r}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self._tunekit_activation = activation

    @property
    def activation(self) -> str | None:
        return self._tunekit_activation

    def forward(self, input: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return _linear_call(self, input) if residual is None else linear_forward(self, input, residual)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


def linear_forward(module: torch.nn.Linear, input: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """act(input @ W.T + b) + residual through tunekit where it can run, else through torch."""
    weight, bias = _attribute(module, "weight"), _attribute(module, "bias")
    activation = module.__dict__.get("_tunekit_activation")
    if runs_here(input, weight, bias, residual):
        return ops.linear(input, weight, bias, activation, residual)
    out = apply_activation(F.linear(input, weight, bias), activation)
    return out if residual is None else out + residual


def linear_by_torch(module: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    weight, bias = _attribute(module, "weight"), _attribute(module, "bias")
    return torch_call_of("linear")(input, weight, bias, module.__dict__.get("_tunekit_activation"), None)


_linear_call = with_torch_shortcut(linear_forward, linear_by_torch, "linear")  # tunekit.nn.Linear's call


def matmul_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """act(x @ W + b) for modules holding W as [in, out] (GPT-2's Conv1D), found by tunekit.patch."""
    weight, bias = param(module, "weight"), param(module, "bias")
    activation = module.__dict__.get("_tunekit_activation")
    assert weight is not None and bias is not None  # patch only marks modules with both
    x2d, out_shape = x.reshape(-1, x.shape[-1]), (*x.shape[:-1], weight.shape[1])
    if not traces_as_model_code("matmul") and runs_here(x, weight, bias):
        return ops.matmul(x2d, weight, bias=bias, activation=activation).view(out_shape)
    return apply_activation(own_forward(module)(module, x), activation)  # its own forward, then the fused act


def matmul_by_torch(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight, bias = param(module, "weight"), param(module, "bias")
    assert weight is not None
    activation = module.__dict__.get("_tunekit_activation")
    product = torch_call_of("matmul")(x.reshape(-1, x.shape[-1]), weight, bias=bias, activation=activation)
    return product.view(*x.shape[:-1], weight.shape[1])
