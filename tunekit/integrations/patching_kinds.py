"""Which leaf modules tunekit.patch swaps, and for what: torch's own modules by type and forward, modules of model
code by structure and what they compute on a probe (patching_probes), never by class name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit import nn as tk_nn
from tunekit.integrations.patching_probes import computes, layer_normalized, norm_eps, probing, rms_normalized

# torch's modules tunekit runs as they are (their constructor arguments are the kernels' arguments): (type, label,
# forward, the forward's op and the torch call it makes where the op serves torch directly).
_TORCH_KINDS: tuple[tuple[type[torch.nn.Module], str, Callable[..., Any], str, Callable[..., Any]], ...] = (
    (torch.nn.LayerNorm, "LayerNorm", tk_nn.layer_norm_forward, "layer_norm", tk_nn.layer_norm_by_torch),
    (torch.nn.RMSNorm, "RMSNorm", tk_nn.rms_norm_forward, "rms_norm", tk_nn.rms_norm_by_torch),
    (torch.nn.Linear, "Linear", tk_nn.linear_forward, "linear", tk_nn.linear_by_torch),
)
_TUNEKIT_MODULES = (tk_nn.LayerNorm, tk_nn.RMSNorm, tk_nn.Linear)  # already on tunekit's kernels
# Norms of model code: (label, statistics, normalize, weight offset): output = normalize(x) * (weight + offset).
_NORM_FORMS: tuple[tuple[str, str, Callable[[torch.Tensor, float], torch.Tensor], float], ...] = (
    ("RMSNorm (by structure)", "rms", rms_normalized, 0.0),
    ("RMSNorm (1 + weight) (by structure)", "rms", rms_normalized, 1.0),  # Gemma's
    ("LayerNorm (by structure)", "layer", layer_normalized, 0.0),
    ("LayerNorm (1 + weight) (by structure)", "layer", layer_normalized, 1.0),
)


@dataclass(frozen=True)
class Swap:
    """What a module is swapped as: the report's label, its new forward, the instance attributes that forward reads."""

    kind: str
    forward: Callable[..., Any]
    attrs: dict[str, object] = field(default_factory=dict)
    probed_width: int | None = None  # decided by probing on inputs this wide: guarded at the call (patching_guard)
    op: str = ""  # the tunekit op it runs (where probed, a compiled trace runs the own forward unless the op traces)
    by_torch: Callable[..., Any] | None = None  # the forward's call of the op's torch fallback (nn.with_torch_shortcut)


def _own_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters(recurse=False))


def _plain(module: torch.nn.Module) -> bool:
    """Its parameters and buffers are plain tensors: no tensor subclass (quantized, distributed) that the kernels
    would read as raw memory."""
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)


def classify(module: torch.nn.Module) -> Swap | str | None:
    """A leaf module's swap, or why a module that looks like one is left as it is (a reason), or None."""
    if isinstance(module, _TUNEKIT_MODULES):
        return None
    torch_kind = next((k for k in _TORCH_KINDS if isinstance(module, k[0])), None)
    if "forward" in module.__dict__ and (torch_kind is not None or _own_params(module)):
        return "its forward is replaced on the instance (a wrapper or hook)"
    if not _plain(module):
        return "its weight is a tensor subclass (quantized or distributed)"
    if torch_kind is not None:
        base, kind, forward, op, by_torch = torch_kind
        if type(module).forward is not base.forward:
            return f"a {base.__name__} subclass with its own forward"
        return Swap(kind, forward, op=op, by_torch=by_torch)
    return _found_norm(module) or _found_input_by_output_projection(module) or _near_miss(module)


def _found_norm(module: torch.nn.Module) -> Swap | None:
    """A norm over the last dim of model code: a 1-D `weight` (and a `bias` for LayerNorm forms), an eps attribute,
    no children, and an output equal to one of _NORM_FORMS on a probe."""
    params, eps = _own_params(module), norm_eps(module)
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None or eps is None or weight.dim() != 1 or set(params) - {"weight", "bias"}:
        return None
    if bias is not None and bias.shape != weight.shape:
        return None
    with probing(module):
        for kind, statistics, normalize, offset in _NORM_FORMS:
            if bias is not None and statistics == "rms":
                continue

            def formula(x: torch.Tensor, normalize: Any = normalize, offset: float = offset) -> torch.Tensor:
                y = normalize(x, eps) * (weight.float() + offset)
                return y if bias is None else y + bias.float()

            if computes(module, weight.shape[0], weight, formula):
                attrs: dict[str, object] = {"_tunekit_norm": (statistics, eps, offset)}
                forward, width, op = tk_nn.found_norm_forward, weight.shape[0], tk_nn.norm_op(statistics)
                return Swap(kind, forward, attrs, probed_width=width, op=op, by_torch=tk_nn.found_norm_by_torch)
    return None


def _found_input_by_output_projection(module: torch.nn.Module) -> Swap | None:
    """A projection holding its weight as [in, out] (GPT-2's Conv1D): a 2-D `weight`, a 1-D `bias`, and an output
    equal to x @ weight + bias on a probe."""
    params = _own_params(module)
    weight, bias = params.get("weight"), params.get("bias")
    if set(params) != {"weight", "bias"} or weight is None or bias is None:
        return None
    if weight.dim() != 2 or bias.shape != (weight.shape[1],):
        return None
    with probing(module):
        found = computes(module, weight.shape[0], weight, lambda x: torch.addmm(bias.float(), x, weight.float()))
    if not found:
        return None
    kind = "Linear [in, out] (by structure)"
    return Swap(kind, tk_nn.matmul_forward, probed_width=weight.shape[0], op="matmul", by_torch=tk_nn.matmul_by_torch)


def _near_miss(module: torch.nn.Module) -> str | None:
    """Why a module with a weight and an eps (a norm by its look) was not swapped."""
    if "weight" in _own_params(module) and norm_eps(module) is not None:
        return "a weight and an eps, but its output is no RMSNorm's or LayerNorm's on a probe"
    return None
