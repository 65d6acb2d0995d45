"""The guard at the call of a swap decided by probing: tunekit's code runs only for call signatures where its
output was found to conform to the original's.

A probe decides what a module or function computes on inputs of one dtype and layout; the model's own calls may
pass others (OLMo-2 hands fp32 cos and sin to bf16 q and k and casts the result back to q's dtype; a norm may keep
an fp32 weight under bf16 activations). So each such swap has a `CallGuard`. Per call signature (the dtypes,
ranks and devices of its tensors and whether autocast is on: `signature`), the first call runs both the original
and tunekit's code without gradients, and tunekit's is kept only where the outputs conform (`mismatch`: the same
dtype, shape, layout class and device, values within the dtype's tolerance); otherwise the original runs for that
signature, said once (logging) and added to the patch report's skipped list. `patch` seeds verdicts for the
dtypes the model holds, so its report says up front what will not run on tunekit.

The verdicts are memoised: a call with the previous call's signature costs one tuple compare.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from tunekit.integrations.patching_probes import can_probe, error, probe_input, tensors_of
from tunekit.nn import own_forward, with_torch_shortcut
from tunekit.runtime.hotpath import traces_as_model_code

_LOG = logging.getLogger("tunekit.patch")
# Values within these of the original's (error relative to its largest value): a semantic mismatch (another
# formula, a lost cast) is far larger; fp32 leaves room for TF32 and another summation order.
_VALUE_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
_HALF_TOLERANCE = 5e-2

Signature = tuple[object, ...]


def signature(first: torch.Tensor, *values: object) -> Signature:
    """What a verdict holds for: each tensor's dtype, rank and device, other values as they are, and whether
    autocast is on for the first tensor's device."""
    device = first.device
    kind = "cuda" if first.is_cuda else device.type  # a torch.device's type costs more than the flag, per call
    parts: list[object] = [torch.is_autocast_enabled(kind), first.dtype, first.dim(), device]
    for value in values:
        if isinstance(value, torch.Tensor):
            parts += (value.dtype, value.dim(), value.device)
        else:
            parts.append(value)
    return tuple(parts)


def layout_class(t: torch.Tensor) -> tuple[bool, tuple[int, ...]]:
    """(contiguous, the dims of size > 1 from the largest stride to the smallest): what code after the call may rely
    on (a `.view`, a kernel reading rows), not the exact strides an allocator picked."""
    dims = sorted((d for d in range(t.dim()) if t.shape[d] > 1), key=lambda d: -t.stride(d))
    return t.is_contiguous(), tuple(dims)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} on {t.device.type}"


def mismatch(got: object, want: object) -> str | None:
    """Why tunekit's output `got` does not stand in for the original's `want`, or None when it does."""
    got_tensors, want_tensors = tensors_of(got), tensors_of(want)
    if want_tensors is None or got_tensors is None or len(got_tensors) != len(want_tensors):
        return "its output is no tensor or tuple of tensors like the original's"
    for a, b in zip(got_tensors, want_tensors):
        if (a.dtype, a.shape, a.device) != (b.dtype, b.shape, b.device):
            return f"tunekit's output is {_describe(a)}, its own {_describe(b)}"
        if layout_class(a) != layout_class(b):
            return f"tunekit's output is laid out as {layout_class(a)}, its own as {layout_class(b)}"
        if b.numel() and b.is_floating_point():
            tolerance = _VALUE_TOLERANCE.get(b.dtype, _HALF_TOLERANCE)
            if error(a, b) > tolerance:
                return f"tunekit's values differ from its own by {error(a, b):.2g} (more than {tolerance:g})"
    return None


def compare(tunekit: Callable[[], Any], original: Callable[[], Any]) -> str | None:
    """mismatch(tunekit(), original()) without gradients; an error of tunekit's code is a reason too (an error of
    the original's is the call's own: it propagates)."""
    with torch.no_grad():
        want = original()
        try:
            got = tunekit()
        except Exception as failure:  # whatever tunekit's code raises, the model runs its own code instead
            return f"tunekit's code raised {type(failure).__name__}: {failure}"
    return mismatch(got, want)


def dtypes_of(*tensors: torch.Tensor) -> str:
    return ", ".join(str(t.dtype).removeprefix("torch.") for t in tensors)


class CallGuard:
    """One swap's verdicts per call signature (True: tunekit's code runs). `skipped` is the patch report's list,
    where a signature that does not conform is added as (`where`, why)."""

    __slots__ = ("_last", "_verdicts", "kind", "mismatched", "skipped", "where")

    def __init__(self, where: str, kind: str, skipped: list[tuple[str, str]] | None = None) -> None:
        self.where, self.kind = where, kind
        self.skipped = [] if skipped is None else skipped
        self._verdicts: dict[Signature, bool] = {}
        self._last: tuple[Signature | None, bool] = (None, False)
        self.mismatched = False  # some signature runs the original

    def verdict(self, sig: Signature) -> bool | None:
        """Whether tunekit's code runs for a call of signature `sig`; None: not checked yet (then `check`). Within a
        trace, an unchecked signature runs the original (never compared outside a trace)."""
        last, verdict = self._last
        if sig == last:
            return verdict
        known = self._verdicts.get(sig)
        if known is not None:
            self._last = (sig, known)
        return known if known is not None or not torch.compiler.is_compiling() else False

    def check(
        self, sig: Signature, tunekit: Callable[[], Any], original: Callable[[], Any], what: Callable[[], str]
    ) -> bool:
        """Compare `tunekit()` with `original()` (no gradients) and record the verdict for `sig`; `what()` names
        the call's inputs for the report."""
        return self.decide(sig, what(), compare(tunekit, original))

    def decide(self, sig: Signature, what: str, reason: str | None) -> bool:
        """Record the verdict for `sig`: tunekit's code runs when there is no `reason` against it."""
        self._verdicts[sig] = reason is None
        self._last = (sig, reason is None)
        if reason is not None:
            self.mismatched = True
            why = f"{self.kind} with {what}: its own code runs ({reason})"
            self.skipped.append((self.where, why))
            _LOG.info("tunekit.patch: %s: %s", self.where or "<model>", why)
        return reason is None


# Why tunekit's forward does not stand in for a module class's own on probes (None: it does), per (class, weight
# dtype and shape, probe signature): the layers of a model share their classes, so each is probed once.
_module_conformance: dict[tuple[object, ...], str | None] = {}


def _input_of(x: torch.Tensor, weight: torch.Tensor | None) -> str:
    held = "" if weight is None else f", weight {dtypes_of(weight)}"
    return f"input {dtypes_of(x)} ({x.dim()}-D){held}"


GUARD = "_tunekit_guard"  # on a module swapped by probing: its CallGuard


def guarded_forward(
    cls: type, tunekit_forward: Callable[..., Any], op: str, by_torch: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """The forward of the class tunekit.patch derives from `cls` for a swap decided by probing:
    `tunekit_forward(module, x)` for call signatures (x and the module's weight) where it conforms to `cls`'s own
    forward, as the module's CallGuard (instance attribute GUARD) found, and `cls`'s forward for every other call.
    Traced by torch.compile where `op` traces as model code, `cls`'s forward before anything of the module is read:
    Dynamo guards what a trace reads (`type(self)` too: a Python guard per pair of modules sharing a class), and
    checks those guards on every compiled call."""

    def forward(self: torch.nn.Module, x: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(x, torch.Tensor) or traces_as_model_code(op):
            return cls.forward(self, x, *args, **kwargs)
        own = cls.forward
        guard: CallGuard = self.__dict__[GUARD]
        weight = self._parameters.get("weight")
        sig = signature(x, weight)
        runs = guard.verdict(sig)
        if runs is None:
            runs = guard.check(
                sig, lambda: tunekit_forward(self, x), lambda: own(self, x), lambda: _input_of(x, weight)
            )
        return tunekit_forward(self, x) if runs else own(self, x)

    # outside the guard: a call the op served torch directly had the guard's verdict for its key
    return forward if by_torch is None else with_torch_shortcut(forward, by_torch, op)


def check_module_dtypes(
    module: torch.nn.Module, tunekit_forward: Callable[..., Any], guard: CallGuard, width: int
) -> None:
    """Seed `guard` with the verdict for the input a model passes the module: [batch, rows, width] in its weight's
    dtype (within `probing`: eval mode, constant parameters random)."""
    weight = module._parameters.get("weight")
    if weight is None or not can_probe(weight):
        return
    x = probe_input(width, weight)[None]
    sig = signature(x, weight)
    key = (type(module), weight.dtype, tuple(weight.shape), sig)
    if key not in _module_conformance:
        try:
            own = own_forward(module)
            _module_conformance[key] = compare(lambda: tunekit_forward(module, x), lambda: own(module, x))
        except Exception:  # its own forward fails on the probe: its first real call decides
            return
    guard.decide(sig, _input_of(x, weight), _module_conformance[key])
