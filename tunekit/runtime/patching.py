"""tunekit.patch(model): an existing model's norms and projections on tunekit's kernels, per instance.

What is swapped, and how each is recognized (by structure and by checking numerically, never by class name):
- torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.Linear whose forward is torch's own;
- an RMSNorm of model code: one 1-D `weight`, an `eps` or `variance_epsilon`, no children, and an output equal to
  x * rsqrt(mean(x^2) + eps) * weight on a random probe (Gemma's (1 + weight) form fails the probe and is left);
- a projection holding its weight as [in, out] (GPT-2's Conv1D): a 2-D `weight`, a 1-D `bias`, no children, and an
  output equal to x @ weight + bias on a probe;
- an activation module applied to one projection's output inside its parent (a gated MLP's SiLU on the gate
  projection, a GELU MLP): fused into that projection's GEMM epilogue, the activation module replaced by Identity.
  The parent's output on a probe input must be unchanged, within the dtype's tolerance, or the fusion is undone.

A swap sets the instance's `forward` (the class is never touched) and marks the module, so patching twice changes
nothing and `unpatch` restores every module and activation exactly.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit import nn as tk_nn

__all__ = ["PatchReport", "patch", "unpatch"]

_MARK = "_tunekit_patch"  # on a swapped module: what it was swapped as
_FUSED = "_tunekit_fused_from"  # on a fused projection: (parent, attribute name, the activation module)
_PROBE_ROWS = 6


@dataclass
class PatchReport:
    swapped: list[tuple[str, str]] = field(default_factory=list)  # (module path, as what)
    fused: list[tuple[str, str]] = field(default_factory=list)  # (projection path, activation)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (module path, why)

    def __str__(self) -> str:
        kinds: dict[str, int] = {}
        for _, kind in self.swapped:
            kinds[kind] = kinds.get(kind, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "nothing"
        return f"tunekit.patch: swapped {parts}; fused {len(self.fused)} activations; skipped {len(self.skipped)}"


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 3e-2


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max error relative to b's largest value; inf when shapes differ or a is not finite."""
    if a.shape != b.shape or not torch.isfinite(a).all():
        return float("inf")
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return _error(a, b) <= _tolerance(a.dtype)


def _probe(dim: int, like: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(dim)
    return torch.randn(_PROBE_ROWS, dim, generator=gen).to(device=like.device, dtype=like.dtype)


def _own_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters(recurse=False))


def _is_rms_norm(module: torch.nn.Module) -> float | None:
    """The eps of a module that computes RMSNorm, else None."""
    params = _own_params(module)
    weight = params.get("weight")
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if set(params) != {"weight"} or weight is None or weight.dim() != 1 or any(True for _ in module.children()):
        return None
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    x = _probe(weight.shape[0], weight)
    try:
        with torch.no_grad():
            out = module(x)
            ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    except Exception:  # a module that is not a function of one tensor
        return None
    return float(eps) if isinstance(out, torch.Tensor) and _close(out, ref) else None


def _is_input_by_output_projection(module: torch.nn.Module) -> bool:
    params = _own_params(module)
    weight, bias = params.get("weight"), params.get("bias")
    if set(params) != {"weight", "bias"} or weight is None or bias is None or any(True for _ in module.children()):
        return False
    if weight.dim() != 2 or bias.shape != (weight.shape[1],) or isinstance(module, torch.nn.Linear):
        return False
    x = _probe(weight.shape[0], weight)
    try:
        with torch.no_grad():
            out = module(x)
            ref = torch.addmm(bias.float(), x.float(), weight.float()).to(x.dtype)
    except Exception:  # a module that is not a function of one tensor
        return False
    return isinstance(out, torch.Tensor) and _close(out, ref)


def _activation_of(module: torch.nn.Module, like: torch.Tensor) -> str | None:
    """Which fusable activation a parameter-free leaf module computes, checked on a probe."""
    if _own_params(module) or any(True for _ in module.children()) or getattr(module, _MARK, None):
        return None
    x = _probe(64, like) * 3
    try:
        with torch.no_grad():
            out = module(x)
    except Exception:  # not an elementwise function of one tensor
        return None
    if not isinstance(out, torch.Tensor):
        return None
    # The closest one: erf and tanh GELU differ by less than a low-precision tolerance.
    errors = {name: _error(out, fn(x.float()).to(x.dtype)) for name, fn in tk_nn.ACTIVATIONS.items()}
    best = min(errors, key=errors.__getitem__)
    return best if errors[best] <= _tolerance(x.dtype) else None


def _swap(module: torch.nn.Module, kind: str, forward: Callable[..., Any]) -> None:
    module.__dict__["forward"] = types.MethodType(forward, module)
    setattr(module, _MARK, kind)


def _swap_leaf(module: torch.nn.Module, path: str, report: PatchReport) -> None:
    """Swap one module if it is a kind tunekit runs."""
    cls = type(module)
    if isinstance(module, torch.nn.LayerNorm) and cls.forward is torch.nn.LayerNorm.forward:
        _swap(module, "LayerNorm", tk_nn.layer_norm_forward)
    elif isinstance(module, torch.nn.RMSNorm) and cls.forward is torch.nn.RMSNorm.forward:
        _swap(module, "RMSNorm", tk_nn.rms_norm_forward)
    elif isinstance(module, torch.nn.Linear) and cls.forward is torch.nn.Linear.forward:
        _swap(module, "Linear", tk_nn.linear_forward)
    elif not isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.Linear)):
        if (eps := _is_rms_norm(module)) is not None:
            module.__dict__["_tunekit_eps"] = eps
            _swap(module, "RMSNorm (by structure)", tk_nn.rms_norm_forward)
        elif _is_input_by_output_projection(module):
            _swap(module, "Linear [in, out] (by structure)", tk_nn.matmul_forward)
        elif "weight" in _own_params(module) and any(hasattr(module, a) for a in ("eps", "variance_epsilon")):
            report.skipped.append((path, "a weight and an eps, but its output is not RMSNorm's on a probe"))
    kind = getattr(module, _MARK, None)
    if kind is not None:
        report.swapped.append((path, kind))


def _parent_output(parent: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    try:
        with torch.no_grad():
            out = parent(x)
    except Exception:  # a parent whose forward takes more than one tensor: nothing fused there
        return None
    return out if isinstance(out, torch.Tensor) else None


def _fuse_in(parent: torch.nn.Module, path: str, report: PatchReport) -> None:
    """Fuse each activation child into the one projection child whose output it is applied to."""
    projections = [(n, m) for n, m in parent.named_children() if getattr(m, _MARK, "").startswith("Linear")]
    if not projections:
        return
    like = _weight(projections[0][1])
    activations = [(n, m, a) for n, m in parent.named_children() if (a := _activation_of(m, like)) is not None]
    for in_dim in dict.fromkeys(_in_features(m) for _, m in projections):
        x = _probe(in_dim, like)
        expected = _parent_output(parent, x)
        if expected is None:
            continue
        for act_name, act_module, activation in activations:
            if getattr(act_module, "_tunekit_taken", False):
                continue
            for proj_name, proj in projections:
                if getattr(proj, "_tunekit_activation", None) is not None:
                    continue
                proj.__dict__["_tunekit_activation"] = activation
                setattr(parent, act_name, torch.nn.Identity())
                fused = _parent_output(parent, x)
                if fused is not None and _close(fused, expected):
                    setattr(proj, _FUSED, (parent, act_name, act_module))
                    act_module.__dict__["_tunekit_taken"] = True
                    report.fused.append((f"{path}.{proj_name}".lstrip("."), activation))
                    break
                proj.__dict__["_tunekit_activation"] = None
                setattr(parent, act_name, act_module)


def _weight(module: torch.nn.Module) -> torch.Tensor:
    weight = tk_nn.param(module, "weight")
    assert weight is not None  # only projections reach here
    return weight


def _in_features(module: torch.nn.Module) -> int:
    weight = _weight(module)
    return int(weight.shape[1] if isinstance(module, torch.nn.Linear) else weight.shape[0])


def patch(model: torch.nn.Module, *, fuse_activations: bool = True) -> PatchReport:
    """Swap the supported submodules of `model` in place (see the module docstring); returns what was done."""
    report = PatchReport()
    for path, module in list(model.named_modules()):
        if getattr(module, _MARK, None) is not None or any(True for _ in module.children()):
            continue
        _swap_leaf(module, path, report)
    if fuse_activations:
        for path, module in list(model.named_modules()):
            if any(True for _ in module.children()):
                _fuse_in(module, path, report)
    return report


def unpatch(model: torch.nn.Module) -> int:
    """Restore every module `patch` swapped and every activation it fused; returns how many were restored."""
    restored = 0
    for module in list(model.modules()):
        fused = module.__dict__.pop(_FUSED, None)
        if fused is not None:
            parent, name, activation = fused
            setattr(parent, name, activation)
            activation.__dict__.pop("_tunekit_taken", None)
        if module.__dict__.pop(_MARK, None) is not None:
            for attr in ("forward", "_tunekit_activation", "_tunekit_eps"):
                module.__dict__.pop(attr, None)
            restored += 1
    return restored
