"""tunekit.patch(model): an existing model's norms and projections on tunekit's kernels, per instance.

What is swapped, and how each is recognized (by structure and by checking numerically, never by class name):
- torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.Linear whose forward is torch's own (a subclass with its own
  forward, e.g. a quantized or LoRA layer, is skipped, as is a module whose weight is a tensor subclass or whose
  forward is already replaced on the instance);
- a norm of model code: a 1-D `weight` (and `bias`), an `eps` or `variance_epsilon`, no children, and an output
  equal, on a probe, to RMSNorm's or LayerNorm's over the last dim times weight or (Gemma's) 1 + weight;
- a projection holding its weight as [in, out] (GPT-2's Conv1D): a 2-D `weight`, a 1-D `bias`, no children, and an
  output equal to x @ weight + bias on a probe;
- rotary position embedding: a module whose forward calls, by global name, a function computing q*cos +
  rotate_half(q)*sin (and the same for k) on a probe runs that code with tunekit's fused RoPE op in its place
  (patching_rope: an instance forward over a copy of its globals);
- a model's next-token loss (`loss_function`, settable, equal on a probe to the shifted mean cross-entropy):
  tunekit's fused cross-entropy on the logits as they are (patching_loss);
- an activation module applied to one projection's output inside its parent (a gated MLP's SiLU on the gate
  projection, a GELU MLP): fused into that projection's GEMM epilogue, the activation module replaced by Identity
  in that parent. The parent's output on a probe input must be unchanged, within the dtype's tolerance, or the
  fusion is undone.
The probes (patching_probes) run in eval mode with constant parameters randomized, so a module that matches only
at its initial values is not taken. Calls the kernels cannot take (another dtype or device, mixed dtypes,
autocast) run the module's own forward, or torch's for torch's modules. A swap decided by probing (norms and
projections by structure, RoPE, the loss) also runs tunekit's code only for call signatures where its output
conforms to the original's (patching_guard: the same dtype, shape, layout class and device, checked for the
model's dtypes at patch time and at the first call of any other signature); the report lists the others as
skipped, with the reason.

A swapped module gets a class derived from its own (same name, `isinstance` holds) whose forward is tunekit's, and a
mark, so patching twice changes nothing and `unpatch` restores every module's class and activation exactly; no
class is modified (the derived one is new), and other modules keep theirs. Not an instance `forward`:
torch.compile guards a bound method in an instance's dict (its code, defaults and owner) on every compiled call,
about twice compile alone's guard time on a 32-layer Llama, where a derived class costs the one type check it
already makes. RoPE's swap keeps its function over per-instance globals on the instance; its derived class's
forward calls it.

Under torch.compile, matrix products with an inner dimension of 1 (a rotary embedding's angles) lower as broadcast
multiplies once a model was patched (inductor_outer_products: exact, and one extern cuBLAS call less per step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit.integrations import inductor_outer_products
from tunekit.integrations.patching_fusion import fuse_in, unfuse
from tunekit.integrations.patching_guard import GUARD, CallGuard, check_module_dtypes, guarded_forward
from tunekit.integrations.patching_kinds import classify
from tunekit.integrations.patching_loss import patch_loss, unpatch_loss
from tunekit.integrations.patching_rope import ROPE, RopeSwap, rope_forward, rope_on_tunekit
from tunekit.nn import SWAPPED_FROM, TORCH_CALL, with_torch_shortcut

__all__ = ["PatchReport", "patch", "unpatch"]

_MARK = "_tunekit_patch"  # on a swapped module: what it was swapped as
# what a swap (or its calls) may set on the instance besides the mark and class
_SWAP_ATTRS = ("_tunekit_norm", GUARD, ROPE, TORCH_CALL)
# (a module's class, how its forward is made, with what) -> the derived class (`_swapped_class`)
_CLASSES: dict[tuple[type, Callable[..., Any], tuple[object, ...]], type] = {}
_RECIPE = "_tunekit_swap"  # on a derived class: (make, args), its key in _CLASSES after the class it derives from
_ROPE = "RoPE (by probe)"
_LOSS = "next-token loss (by probe)"
_SHOWN_PATHS = 3  # per reason, in the report's text


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
        fused = f"{len(self.fused)} activation{'' if len(self.fused) == 1 else 's'}"
        lines = [f"tunekit.patch: swapped {parts}; fused {fused}; skipped {len(self.skipped)}"]
        by_reason: dict[str, list[str]] = {}
        for path, why in self.skipped:
            by_reason.setdefault(why, []).append(path or "<model>")
        for why, paths in by_reason.items():
            more = f" and {len(paths) - _SHOWN_PATHS} more" if len(paths) > _SHOWN_PATHS else ""
            lines.append(f"  skipped {', '.join(paths[:_SHOWN_PATHS])}{more}: {why}")
        return "\n".join(lines)


def _as_is(cls: type, forward: Callable[..., Any], op: str, by_torch: Callable[..., Any] | None) -> Callable[..., Any]:
    """A derived class's forward that needs nothing of `cls` (torch's modules: tunekit's forward as it is)."""
    return forward if by_torch is None else with_torch_shortcut(forward, by_torch, op)


# How a derived class's forward is made from the class it derives from: `make(cls, *args)` (`_as_is`,
# patching_guard.guarded_forward, patching_rope.rope_on_tunekit). The last two close over `cls` for its own forward:
# `type(self)` in traced code costs guards.
Make = Callable[..., Callable[..., Any]]


def _swapped_class(cls: type, make: Make, *args: object) -> type:
    """`cls` with `make(cls, *args)` as its forward: one class per (cls, make, args), shared by every module
    swapped alike."""
    swapped = _CLASSES.get((cls, make, args))
    if swapped is None:
        namespace = {
            "forward": make(cls, *args),
            SWAPPED_FROM: cls,
            "__module__": cls.__module__,
            "__doc__": cls.__doc__,
            "__reduce_ex__": _reduce_swapped,
            _RECIPE: (make, args),
        }
        swapped = type(cls)(cls.__name__, (cls,), namespace)
        swapped.__qualname__ = cls.__qualname__
        _CLASSES[(cls, make, args)] = swapped
    return swapped


def _new_swapped(cls: type, make: Make, args: tuple[object, ...]) -> torch.nn.Module:
    swapped = _swapped_class(cls, make, *args)
    return swapped.__new__(swapped)


def _reduce_swapped(module: torch.nn.Module, protocol: int) -> tuple[Any, ...]:
    """Pickled as the recipe of its class (no module holds the derived class by name), then its state."""
    _, _, *rest = object.__reduce_ex__(module, protocol)
    cls = type(module).__dict__
    return (_new_swapped, (cls[SWAPPED_FROM], *cls[_RECIPE]), *rest)


def _derived(module: torch.nn.Module, path: str, report: PatchReport, make: Make, *args: object) -> type | None:
    """The class a swap gives `module` (`_swapped_class`), or None, with the reason in the report."""
    try:
        return _swapped_class(type(module), make, *args)
    except Exception as failure:  # a class that refuses subclasses (its __init_subclass__ or metaclass)
        report.skipped.append((path, f"its class cannot be derived ({type(failure).__name__}: {failure})"))
        return None


def _swap_leaf(module: torch.nn.Module, path: str, report: PatchReport) -> None:
    """Swap one leaf module if it is a kind tunekit runs; record why one that looks like it is left."""
    found = classify(module)
    if isinstance(found, str):
        report.skipped.append((path, found))
    elif found is not None:
        if found.probed_width is None:
            swapped = _derived(module, path, report, _as_is, found.forward, found.op, found.by_torch)
        else:
            swapped = _derived(module, path, report, guarded_forward, found.forward, found.op, found.by_torch)
        if swapped is None:
            return
        module.__dict__.update(found.attrs)
        if found.probed_width is not None:
            guard = CallGuard(path, found.kind, report.skipped)
            check_module_dtypes(module, found.forward, guard, found.probed_width)
            module.__dict__[GUARD] = guard
        module.__class__ = swapped
        module.__dict__[_MARK] = found.kind
        report.swapped.append((path, found.kind))


def _is_projection(module: torch.nn.Module) -> bool:
    return str(module.__dict__.get(_MARK, "")).startswith("Linear")


def _held_twice(model: torch.nn.Module) -> set[int]:
    """Ids of the modules that more than one parent holds (or one parent under two names)."""
    seen: set[int] = set()
    twice: set[int] = set()
    for _, module in model.named_modules(remove_duplicate=False):
        (twice if id(module) in seen else seen).add(id(module))
    return twice


def patch(model: torch.nn.Module, *, fuse_activations: bool = True) -> PatchReport:
    """Swap the supported submodules of `model` in place (see the module docstring); returns what was done."""
    inductor_outer_products.install()  # for the compiles of this process (exact; module docstring)
    report = PatchReport()
    for path, module in list(model.named_modules()):
        if module.__dict__.get(_MARK) is None and not any(True for _ in module.children()):
            _swap_leaf(module, path, report)
    for path, module in list(model.named_modules()):
        guard = CallGuard(path, _ROPE, report.skipped)
        found = None if module.__dict__.get(_MARK) is not None else rope_forward(module, guard)
        swapped = None if found is None else _derived(module, path, report, rope_on_tunekit)
        if found is not None and swapped is not None:
            module.__dict__[ROPE] = RopeSwap(found[0], guard)
            module.__class__ = swapped
            module.__dict__[_MARK] = _ROPE
            report.swapped.append((path, _ROPE))
    # the model's own loss (a submodule's loss_function is never called for it)
    if patch_loss(model, CallGuard("", _LOSS, report.skipped)):
        report.swapped.append(("", _LOSS))
    if fuse_activations:
        shared = _held_twice(model)
        for path, module in list(model.named_modules()):
            if any(True for _ in module.children()):
                report.fused += fuse_in(module, path, _is_projection, shared)
    return report


def unpatch(model: torch.nn.Module) -> int:
    """Restore every module `patch` swapped and every activation it fused; returns how many were restored."""
    restored = int(unpatch_loss(model))
    for module in list(model.modules()):
        unfuse(module)
        if module.__dict__.pop(_MARK, None) is not None:
            for attr in _SWAP_ATTRS:
                module.__dict__.pop(attr, None)
            module.__class__ = type(module).__dict__.get(SWAPPED_FROM, type(module))
            restored += 1
    return restored
