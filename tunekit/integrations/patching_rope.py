"""Rotary position embedding of model code on tunekit's fused kernel, per instance.

Attention code applies RoPE by calling a module-level function (transformers' `apply_rotary_pos_emb(q, k, cos,
sin)`: q*cos + rotate_half(q)*sin, and the same for k) that runs five or six torch kernels per tensor. A module
whose class forward calls, by global name, a function that computes exactly that on a random probe gets an
instance forward: the same code object with a copy of its globals in which that name is tunekit's op
(`tunekit.ops.rotary_embedding`). The op's calls that it cannot take, and calls with other arguments than
(q, k, cos, sin[, unsqueeze_dim]), run the original function. Recognized by what the function computes, never by
a name; neither the class nor the module's globals are touched, so other instances run as before.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from tunekit import ops
from tunekit.runtime.hotpath import traces_as_model_code

_PROBE_SHAPES = ((2, 3, 5, 8), (2, 2, 5, 8), (2, 5, 8))  # q (3 heads), k (2: grouped-query), cos and sin
_computes_rope: dict[Callable[..., Any], bool] = {}  # a function shared by every layer is probed once


def rope_forward(module: torch.nn.Module) -> tuple[Callable[..., Any], list[str]] | None:
    """(the instance forward computing RoPE on tunekit's op, the global names replaced), or None."""
    forward = getattr(type(module), "forward", None)
    if not isinstance(forward, types.FunctionType) or "forward" in module.__dict__:
        return None  # a wrapped forward (its code calls the inner function) or one replaced on the instance
    names = [name for name in forward.__code__.co_names if _is_rope(forward.__globals__.get(name))]
    if not names:
        return None
    scope = dict(forward.__globals__)
    scope.update({name: _fused(forward.__globals__[name]) for name in names})
    patched = types.FunctionType(forward.__code__, scope, forward.__name__, forward.__defaults__, forward.__closure__)
    patched.__kwdefaults__ = forward.__kwdefaults__
    patched.__qualname__, patched.__doc__ = forward.__qualname__, forward.__doc__

    def rope_on_tunekit(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Compiled with RoPE not swapped: the class's own forward, so the graph is compile alone's (dynamo also
        # cannot guard on globals of a function whose globals are not its module's).
        own = forward if traces_as_model_code("rotary_embedding") else patched
        return own(self, *args, **kwargs)

    return types.MethodType(rope_on_tunekit, module), names


def _is_rope(fn: object) -> bool:
    if not isinstance(fn, types.FunctionType):
        return False
    known = _computes_rope.get(fn)
    if known is None:
        known = _computes_rope[fn] = _probe(fn)
    return known


def _probe(fn: Callable[..., Any]) -> bool:
    try:
        if len(inspect.signature(fn).parameters) < 4:
            return False
    except (TypeError, ValueError):
        return False
    generator = torch.Generator().manual_seed(0)
    q, k, cos, sin = (torch.randn(s, generator=generator) for s in (*_PROBE_SHAPES, _PROBE_SHAPES[2]))
    try:
        with torch.no_grad():
            out = fn(q, k, cos, sin)
    except Exception:  # any function of model code: one that fails on the probe is not RoPE
        return False
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        return False
    expected = (rotary_reference(q, cos, sin), rotary_reference(k, cos, sin))
    return all(got.shape == want.shape and torch.allclose(got, want, atol=1e-5) for got, want in zip(out, expected))


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """x*cos + rotate_half(x)*sin, cos and sin unsqueezed at `unsqueeze_dim` (the form the probe accepts)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _same_width(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) for t in tensors) and len({t.shape[-1] for t in tensors}) == 1


def _fused(original: Callable[..., Any]) -> Callable[..., Any]:
    def rotary_embedding(q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
        # Only calls of the probed form: (q, k, cos, sin[, unsqueeze_dim]) with cos and sin as wide as q and k
        # (a partial rotary, GPT-NeoX's, splits q itself); anything else runs as it did.
        probed_form = not args and not set(kwargs) - {"unsqueeze_dim"}
        if not probed_form or not _same_width(q, k, cos, sin):
            return original(q, k, cos, sin, *args, **kwargs)
        return ops.rotary_embedding(q, k, cos, sin, kwargs.get("unsqueeze_dim", 1))

    rotary_embedding.__wrapped__ = original  # type: ignore[attr-defined]
    return rotary_embedding
