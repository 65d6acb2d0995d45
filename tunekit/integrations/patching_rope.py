"""Rotary position embedding of model code on tunekit's fused kernel, per instance.

Attention code applies RoPE by calling a module-level function (transformers' `apply_rotary_pos_emb(q, k, cos,
sin)`: q*cos + rotate_half(q)*sin, and the same for k) that runs five or six torch kernels per tensor. A module
whose class forward calls, by global name, a function that computes exactly that on a random probe runs the same
code object over a copy of its globals in which that name is tunekit's op (`tunekit.ops.rotary_embedding`), held
on the instance and called by the forward of a class derived from the module's (`rope_on_tunekit`). The op's
calls that it cannot take, and calls with other arguments than (q, k, cos, sin[, unsqueeze_dim]), run the original
function. Recognized by what the function computes, never by a name; neither the module's class nor its module's
globals are changed, so other instances run as before.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tunekit import ops
from tunekit.integrations.patching_guard import CallGuard, Signature, compare, dtypes_of, signature
from tunekit.nn import call_key, torch_call_of
from tunekit.runtime import hotpath
from tunekit.runtime.hotpath import traces_as_model_code

_PROBE_SHAPES = ((2, 3, 5, 8), (2, 2, 5, 8), (2, 5, 8))  # q (3 heads), k (2: grouped-query), cos and sin
_computes_rope: dict[Callable[..., Any], bool] = {}  # a function shared by every layer is probed once
# Why the op does not stand in for a RoPE function on probes of one dtype combination (None: it does), per
# function and call signature: probed once for every layer that calls the function.
_conformance: dict[tuple[Callable[..., Any], Signature], str | None] = {}


ROPE = "_tunekit_rope"  # on a module whose RoPE is swapped: its RopeSwap


@dataclass(frozen=True)
class RopeSwap:
    """A module's forward over the swapped globals and the CallGuard its swapped function keeps verdicts in. A deep
    copy of the module shares both: the function's closure holds the guard, and compiled calls trust its verdicts."""

    forward: Callable[..., Any]
    guard: CallGuard

    def __deepcopy__(self, memo: dict[int, Any]) -> RopeSwap:
        return self


def rope_forward(
    module: torch.nn.Module, guard: CallGuard | None = None
) -> tuple[Callable[..., Any], list[str]] | None:
    """(the module's class forward over a copy of its globals in which RoPE is tunekit's op, as a function of
    (self, ...); the global names replaced), or None. `guard` keeps the verdicts per call signature (a new one when
    not given)."""
    forward = getattr(type(module), "forward", None)
    if not isinstance(forward, types.FunctionType) or "forward" in module.__dict__:
        return None  # a wrapped forward (its code calls the inner function) or one replaced on the instance
    names = [name for name in forward.__code__.co_names if _is_rope(forward.__globals__.get(name))]
    if not names:
        return None
    guard = guard or CallGuard("", "RoPE")
    scope = dict(forward.__globals__)
    scope.update({name: _fused(forward.__globals__[name], guard) for name in names})
    for name in names:
        _check_model_dtypes(forward.__globals__[name], module, guard)
    patched = types.FunctionType(forward.__code__, scope, forward.__name__, forward.__defaults__, forward.__closure__)
    patched.__kwdefaults__ = forward.__kwdefaults__
    patched.__qualname__, patched.__doc__ = forward.__qualname__, forward.__doc__
    return patched, names


def rope_on_tunekit(cls: type) -> Callable[..., Any]:
    """The forward of the class tunekit.patch derives from `cls` for a module whose RoPE it swaps: the module's
    forward over the swapped globals (instance attribute ROPE). Compiled with RoPE traced as model code, `cls`'s own
    forward, before anything of the module is read: the graph is compile alone's (Dynamo also cannot guard on
    globals of a function whose globals are not its module's). A function swapped in a copy of the globals is no
    place for per-call checks under Dynamo (it cannot guard on that function's closure): compiled, a module with a
    signature the op does not conform for runs its own code throughout."""

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if traces_as_model_code("rotary_embedding"):
            return cls.forward(self, *args, **kwargs)
        swap: RopeSwap = self.__dict__[ROPE]
        if swap.guard.mismatched and torch.compiler.is_compiling():
            return cls.forward(self, *args, **kwargs)
        return swap.forward(self, *args, **kwargs)

    return forward


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


def _what(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> str:
    return f"q, k, cos, sin of {dtypes_of(q, k, cos, sin)}"


def _rope_key(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: object) -> tuple[object, ...] | None:
    """tk_nn.call_key of a RoPE call (with its unsqueeze_dim: the op's screen reads shapes, dtypes and that)."""
    tensor = torch.Tensor
    if not (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(cos, tensor) and isinstance(sin, tensor)):
        return None
    key = call_key(q, k, cos, sin)
    return None if key is None else (*key, unsqueeze_dim)


def _fused(original: Callable[..., Any], guard: CallGuard) -> Callable[..., Any]:
    hot = hotpath.op_named("rotary_embedding")
    last: list[tuple[object, ...] | None] = [None]  # the key of the last call the op served torch's formula

    def rotary_embedding(q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
        # Only calls of the probed form: (q, k, cos, sin[, unsqueeze_dim]) with cos and sin as wide as q and k
        # (a partial rotary, GPT-NeoX's, splits q itself), of a signature where the op conforms to the original;
        # anything else runs as it did.
        probed_form = not args and not set(kwargs) - {"unsqueeze_dim"}
        unsqueeze_dim = kwargs.get("unsqueeze_dim", 1)
        shortcut = probed_form and not torch.compiler.is_compiling() and last[0] is not None
        if shortcut and _rope_key(q, k, cos, sin, unsqueeze_dim) == last[0]:
            hot.stats.torch_direct += 1  # that key's checks all passed and its op call was torch's: again
            return torch_call_of("rotary_embedding")(q, k, cos, sin, unsqueeze_dim)
        if not probed_form or not _same_width(q, k, cos, sin):
            return original(q, k, cos, sin, *args, **kwargs)
        if torch.compiler.is_compiling():  # checked by the instance forward (rope_on_tunekit)
            return ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim)
        before = hot.stats.torch_direct
        out = _guarded(q, k, cos, sin, unsqueeze_dim, kwargs)
        last[0] = _rope_key(q, k, cos, sin, unsqueeze_dim) if hot.stats.torch_direct == before + 1 else None
        return out

    def _guarded(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any, kwargs: dict[str, Any]) -> Any:
        sig = signature(q, k, cos, sin, unsqueeze_dim)
        runs = guard.verdict(sig)
        if runs is None:
            runs = guard.check(
                sig,
                lambda: ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim),
                lambda: original(q, k, cos, sin, **kwargs),
                lambda: _what(q, k, cos, sin),
            )
        if runs:
            return ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim)
        return original(q, k, cos, sin, **kwargs)

    rotary_embedding.__wrapped__ = original  # type: ignore[attr-defined]
    return rotary_embedding


def _check_model_dtypes(original: Callable[..., Any], module: torch.nn.Module, guard: CallGuard) -> None:
    """Seed `guard` with the verdicts for the dtypes a model in the module's dtype passes: q, k, cos and sin all in
    it, and cos and sin in fp32 (rotary embeddings that compute them in fp32 and leave them so)."""
    like = next((p for p in module.parameters() if p.is_floating_point()), None)
    if like is None or like.device.type == "meta":
        return
    generator = torch.Generator().manual_seed(0)
    q, k, cos, sin = (torch.randn(s, generator=generator) for s in (*_PROBE_SHAPES, _PROBE_SHAPES[2]))
    q, k = q.to(like), k.to(like)
    for angles in dict.fromkeys((like.dtype, torch.float32)):
        c, s = cos.to(like.device, angles), sin.to(like.device, angles)
        sig = signature(q, k, c, s, 1)
        key = (original, sig)
        if key not in _conformance:
            try:
                _conformance[key] = compare(
                    lambda c=c, s=s: ops.rotary_embedding(q, k, c, s), lambda c=c, s=s: original(q, k, c, s)
                )
            except Exception:  # the original fails on this probe: its first real call of the kind decides
                continue
        guard.decide(sig, _what(q, k, c, s), _conformance[key])
