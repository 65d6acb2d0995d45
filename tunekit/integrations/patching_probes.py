"""The numeric probes tunekit.patch recognizes modules by: what a module computes, checked on random inputs.

A probe is only as good as its input and the parameters it runs with, so:
- probe rows have different means and scales (a mean-subtracting norm is no RMSNorm; a wrong eps shows on the
  small row);
- parameters whose elements are all equal (fresh zeros or ones, as models initialize norms, gates and zero-init
  projections) are replaced by random values while probing: a module or parent that merely matches at its
  initial values is not taken for one that matches at every value;
- probes run in eval mode (dropout off), each module's mode restored after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from tunekit import nn as tk_nn

_ROW_MEANS = (0.0, 2.0, -1.0, 0.5, 0.0, 1.0)  # mean-subtracting norms differ from RMSNorm on these
_ROW_SCALES = (1.0, 1.0, 3.0, 0.5, 3e-3, 1.0)  # at 3e-3, x^2 is near a typical eps: a wrong eps shows
_ACTIVATION_RANGE = 50.0  # activations are probed on [-50, 50]: clipped variants differ at the ends


def tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 3e-2


def error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max error relative to b's largest value; inf when shapes differ or a is not finite."""
    if a.shape != b.shape or not torch.isfinite(a).all():
        return float("inf")
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return error(a, b) <= tolerance(a.dtype)


def can_probe(like: torch.Tensor) -> bool:
    """Whether probes can run with tensors like this one: not on the meta device (a model not loaded yet)."""
    return like.device.type != "meta"


def probe_input(dim: int, like: torch.Tensor) -> torch.Tensor:
    """Rows of `dim` random values, each row with its own mean and scale; `like`'s device and dtype."""
    gen = torch.Generator(device="cpu").manual_seed(dim)
    means, scales = torch.tensor(_ROW_MEANS)[:, None], torch.tensor(_ROW_SCALES)[:, None]
    x = (torch.randn(len(_ROW_MEANS), dim, generator=gen) + means) * scales
    return x.to(device=like.device, dtype=like.dtype)


def _random_like(p: torch.Tensor, seed: int) -> torch.Tensor:
    """Random values of p's shape around p's (constant) value, of a scale its role suggests."""
    value = float(p.detach().flatten()[0].float())
    scale = 0.5 * abs(value) if value != 0 else (p.shape[-1] ** -0.5 if p.dim() >= 2 else 0.5)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(p.shape, generator=gen) * scale
    return (value + noise).to(device=p.device, dtype=p.dtype)


def _is_constant(p: torch.Tensor) -> bool:
    if p.numel() == 0 or not p.is_floating_point() or not can_probe(p):
        return False
    flat = p.detach().flatten()
    return bool((flat == flat[0]).all())


@contextmanager
def probing(module: torch.nn.Module) -> Iterator[None]:
    """Within: `module` and its children in eval mode, its constant parameters random; all restored after."""
    modes = [(m, m.training) for m in module.modules()]
    swapped = [(p, p.data) for p in module.parameters() if _is_constant(p)]
    try:
        module.train(False)
        for seed, (p, data) in enumerate(swapped):
            p.data = _random_like(data, seed)
        yield
    finally:
        for p, data in swapped:
            p.data = data
        for m, training in modes:
            m.training = training


def tensors_of(out: object) -> list[torch.Tensor] | None:
    """A forward's output as a list of tensors (a tensor, or a tuple or list of them), else None."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return None


def call(module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor] | None:
    """module(x) without gradients as tensors; None when it is not a function of one tensor."""
    try:
        with torch.no_grad():
            return tensors_of(module(x))
    except Exception:  # a forward that takes more than one tensor, or another shape
        return None


def computes(module: torch.nn.Module, dim: int, like: torch.Tensor, formula: Callable[..., torch.Tensor]) -> bool:
    """Whether module(x) equals formula(x) (in fp32, cast back) on a probe of `dim` features; run within `probing`."""
    if not can_probe(like):
        return False
    x = probe_input(dim, like)
    out = call(module, x)
    if out is None or len(out) != 1:
        return False
    try:
        with torch.no_grad():
            ref = formula(x.float()).to(x.dtype)
    except Exception:  # a parameter of another shape than the formula takes
        return False
    return close(out[0], ref)


def norm_eps(module: torch.nn.Module) -> float | None:
    """The epsilon a norm module keeps as an attribute (`eps` or `variance_epsilon`), if a number."""
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    return float(eps)


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def layer_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), None, None, eps)


def activation_of(module: torch.nn.Module, like: torch.Tensor) -> str | None:
    """Which fusable activation a parameter-free leaf module computes, checked in fp32 on [-50, 50]."""
    if any(True for _ in module.parameters()) or any(True for _ in module.children()):
        return None
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.cat([torch.randn(256, generator=gen) * 3, torch.linspace(-_ACTIVATION_RANGE, _ACTIVATION_RANGE, 201)])
    x = x.to(like.device)
    out = call(module, x)
    if out is None or len(out) != 1 or out[0].dtype != torch.float32:
        return None
    errors = {name: _pointwise_error(out[0], fn(x)) for name, fn in tk_nn.ACTIVATIONS.items()}
    best = min(errors, key=errors.__getitem__)
    return best if errors[best] <= tolerance(torch.float32) else None


def _pointwise_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max of |a - b| / (1 + |b|): each value on its own (erf and tanh GELU differ by 5e-4 near -2.7, which an
    error relative to the largest output would hide)."""
    if a.shape != b.shape or not torch.isfinite(a).all():
        return float("inf")
    return float(((a - b).abs() / (1 + b.abs())).max())
