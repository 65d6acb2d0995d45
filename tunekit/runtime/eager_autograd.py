"""Eager training without the custom-op dispatcher: one torch.autograd.Function per op, built from the same pieces
the op registers with torch.library (its implementation, setup_context and backward formula).

Why: a call through a `torch.library.custom_op` with a registered autograd formula costs hundreds of microseconds
of host time per call in eager mode (the dispatcher's autograd, redispatch and aliasing checks; measured on an
H200 host, 2026-11-24, tests/gpu/norm_backward_bench.py), several times a norm's GPU time. The custom op stays
what torch.compile traces; eager calls whose gradients flow take this Function instead, which runs the same
implementation and the same backward formula, so both paths compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

SetupContext = Callable[[Any, tuple[Any, ...], Any], None]
# Every Function made here: the hot path asks whether a call's autograd graph runs one of them.
FUNCTIONS: set[type[torch.autograd.Function]] = set()


def eager_function(
    name: str,
    forward: Callable[..., Any],
    setup_context: SetupContext,
    backward: Callable[..., Any],
) -> type[torch.autograd.Function]:
    """An autograd Function running `forward(*args)`, then `setup_context(ctx, args, output)`; its backward is
    `backward(ctx, *grads)`, returning one gradient (or None) per argument, as `register_autograd` expects."""

    def run_forward(ctx: Any, *args: Any) -> Any:
        output = forward(*args)
        setup_context(ctx, args, output)
        return output

    @once_differentiable  # double backward raises, as the custom op's does
    def run_backward(ctx: Any, *grads: Any) -> Any:
        return backward(ctx, *grads)

    body = {"forward": staticmethod(run_forward), "backward": staticmethod(run_backward)}
    function = type(name, (torch.autograd.Function,), body)
    FUNCTIONS.add(function)
    return function


def runs_tunekit_backward(result: Any, inputs: list[torch.Tensor]) -> bool:
    """Whether the autograd graph a call added (from its result back to its inputs' own history) holds one of
    these Functions, i.e. whether its backward runs tunekit's kernels rather than torch's alone."""
    stop = {id(t.grad_fn) for t in inputs if t.grad_fn is not None}
    outputs = result if isinstance(result, tuple) else (result,)
    frontier = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor)]
    seen: set[int] = set()
    while frontier:
        node = frontier.pop()
        if node is None or id(node) in stop or id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "_forward_cls", None) in FUNCTIONS:
            return True
        frontier.extend(next_node for next_node, _ in node.next_functions)
    return False
