"""A language model's loss on tunekit's fused cross-entropy, per instance.

A model exposing a settable `loss_function(logits, labels, vocab_size, ...)` (transformers' models do) whose
result equals, on a random probe, the next-token loss (labels shifted by one, mean cross-entropy over the targets
that are not -100, computed in fp32) gets an instance loss function running `tunekit.ops.cross_entropy` on the
logits as they are: no fp32 copy of the logits, and the gradient written in the forward pass. Calls with other
arguments than the probed ones run the original. Recognized by what it computes; `unpatch` restores it. Like
every swap decided by probing, the fused loss runs only for call signatures where its result conforms to the
original's (patching_guard), checked at the first call of each on the first sequence's first positions (a full
fp32 copy of the logits is what the fused loss is there to avoid).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tunekit import ops
from tunekit.integrations.patching_guard import CallGuard, dtypes_of, signature
from tunekit.ops import row_softmax as loss
from tunekit.runtime import recorder
from tunekit.runtime.hotpath import traces_as_model_code

_KEPT = "_tunekit_loss_function"  # on a patched model: (whether it held its own loss function, the original)
_IGNORE = -100
_ACCEPTED = {"num_items_in_batch", "ignore_index"}  # the arguments the fused loss handles itself
_CHECKED_POSITIONS = 16  # of the first sequence: what the first call of a signature compares


def patch_loss(model: torch.nn.Module, guard: CallGuard | None = None) -> bool:
    """Swap the model's loss function if it is the next-token cross-entropy; True when swapped. `guard` keeps the
    verdicts per call signature (a new one when not given)."""
    if _KEPT in model.__dict__ or not _forward_calls_loss_function(model):
        return False
    original = getattr(model, "loss_function", None)
    if not callable(original) or not _is_next_token_loss(original):
        return False
    own = "_loss_function" in model.__dict__
    try:
        setattr(model, "loss_function", _fused(original, guard or CallGuard("", "next-token loss")))  # noqa: B010  (Module's __setattr__ types it a tensor)
    except AttributeError:  # not settable: left as it is
        return False
    model.__dict__[_KEPT] = (own, original)
    return True


def unpatch_loss(model: torch.nn.Module) -> bool:
    kept = model.__dict__.pop(_KEPT, None)
    if kept is None:
        return False
    own, original = kept
    if own:
        setattr(model, "loss_function", original)  # noqa: B010
    else:
        model.__dict__.pop("_loss_function", None)  # what the setter wrote: the class's loss again
    return True


def _forward_calls_loss_function(model: torch.nn.Module) -> bool:
    """Whether the class's forward (under its decorators) reads `loss_function`: a model that computes its loss
    some other way (T5 builds its own CrossEntropyLoss) gains nothing from a swap and would misreport one."""
    forward = inspect.unwrap(getattr(type(model), "forward", None) or (lambda: None))
    code = getattr(forward, "__code__", None)
    return code is not None and "loss_function" in code.co_names


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = _IGNORE) -> torch.Tensor:
    """The reference the probe accepts: labels shifted by one, mean cross-entropy in fp32 over kept targets."""
    shifted = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return F.cross_entropy(logits.float().flatten(0, -2), shifted.flatten(), ignore_index=ignore_index)


def _is_next_token_loss(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if len(parameters) < 3:
        return False
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=generator) * 3
    labels = torch.randint(0, 11, (2, 6), generator=generator)
    labels[0, 2] = labels[1, 4] = _IGNORE
    try:
        with torch.no_grad():
            got = fn(logits, labels, vocab_size=11)
    except Exception:  # any function of model code: one that fails on the probe is not this loss
        return False
    expected = next_token_loss(logits, labels)
    return isinstance(got, torch.Tensor) and got.numel() == 1 and bool(torch.allclose(got.float(), expected))


def _fused(original: Callable[..., Any], guard: CallGuard) -> Callable[..., Any]:
    def next_token_cross_entropy(logits: Any, labels: Any, vocab_size: Any = None, **kwargs: Any) -> Any:
        probed_form = (
            isinstance(logits, torch.Tensor)
            and isinstance(labels, torch.Tensor)
            and not (set(kwargs) - _ACCEPTED or kwargs.get("shift_labels") is not None)
        )
        if not probed_form or traces_as_model_code("cross_entropy") or vocab_size not in (None, logits.shape[-1]):
            return original(logits, labels, vocab_size, **kwargs)  # compiled: the compiler fuses the original
        ignore_index = kwargs.get("ignore_index", _IGNORE)
        shifted = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1).to(logits.device)
        rows = logits.reshape(-1, logits.shape[-1])
        # (compiled: the op's body picks kernel or torch code per problem when traced)
        if not torch.compiler.is_compiling() and not loss.kernel_serves(rows, shifted, ignore_index, "none"):
            return original(logits, labels, vocab_size, **kwargs)  # torch's op on fp32 logits, as written
        # kwargs by name and kind: num_items_in_batch changes every step, its signature does not
        sig = signature(
            logits, labels, tuple(kwargs), *(v if isinstance(v, torch.Tensor) else type(v) for v in kwargs.values())
        )
        runs = guard.verdict(sig)
        if runs is None:
            runs = _check(guard, sig, original, logits, labels, vocab_size, kwargs)
        if not runs:
            return original(logits, labels, vocab_size, **kwargs)
        return _fused_loss(rows, shifted, ignore_index, kwargs.get("num_items_in_batch"))

    next_token_cross_entropy.__wrapped__ = original  # type: ignore[attr-defined]
    return next_token_cross_entropy


def _fused_loss(rows: torch.Tensor, shifted: torch.Tensor, ignore_index: int, items: Any) -> torch.Tensor:
    # Per-row losses (fp32 math, rounded once to the logits' dtype), summed in fp32: the loss keeps fp32's
    # precision without an fp32 copy of the logits.
    per_row = ops.cross_entropy(rows, shifted, ignore_index=ignore_index, reduction="none").float()
    if items is None:
        return per_row.sum() / (shifted != ignore_index).sum()
    return per_row.sum() / (items.to(per_row.device) if isinstance(items, torch.Tensor) else items)


def _check(
    guard: CallGuard,
    sig: tuple[object, ...],
    original: Callable[..., Any],
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: Any,
    kwargs: dict[str, Any],
) -> bool:
    """The verdict for a new signature: both losses on the first sequence's first positions."""
    if logits.dim() < 2 or labels.dim() != logits.dim() - 1:
        return guard.decide(sig, f"logits {logits.dim()}-D, labels {labels.dim()}-D", "another layout than probed")
    lead = (0,) * (logits.dim() - 2)
    few_logits, few_labels = logits[lead][None, :_CHECKED_POSITIONS], labels[lead][None, :_CHECKED_POSITIONS]
    ignore_index = kwargs.get("ignore_index", _IGNORE)
    shifted = F.pad(few_labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1).to(logits.device)
    items = kwargs.get("num_items_in_batch")

    def fused() -> torch.Tensor:
        with recorder.paused():  # a slice of the step's logits: no problem of the model's, so not in its plan
            return _fused_loss(few_logits.reshape(-1, logits.shape[-1]), shifted, ignore_index, items)

    return guard.check(
        sig,
        fused,
        lambda: original(few_logits, few_labels, vocab_size, **kwargs),
        lambda: f"logits, labels of {dtypes_of(logits, labels)}",
    )
