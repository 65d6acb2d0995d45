"""One declaration per op, from which tunekit.ops generates what torch and the hot path need.

An op module writes what only it knows: the public front (validation, torch's contract, whether torch's own op
trains the call), the body (the kernel path, which runs torch's code where dispatch serves torch), the fake, and,
for an op that trains, its setup and backward formula. `declare` turns a declaration into
- the torch custom op `tunekit::<name>` (a `torch.library.triton_op`, so torch.compile decomposes a call into
  the body's launches) with its fake and its registered autograd;
- the eager autograd Function (the same body and formula without the custom-op dispatcher's host cost), whose
  bodies replay as hot-path plans;
- `DeclaredOp.run`, the one routing every front ends in: compiling -> the custom op, training -> the eager
  Function, otherwise -> the body;
and `public_op` wraps the front as a hot-path op with its torch fallback and the kernels that serve it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

import torch
from torch.library import CustomOpDef

from tunekit.ops._launch import kernel_op, served_by
from tunekit.runtime.dispatch import Dispatcher
from tunekit.runtime.eager_autograd import SetupContext, eager_function
from tunekit.runtime.hotpath import Screen, hot_path

F = TypeVar("F", bound=Callable[..., Any])
SELF = "self"  # Autograd.through: the op's gradients run through the op itself (GEMM's dA and dB are GEMMs)


@dataclass(frozen=True)
class Runs:
    """A backward problem run by plain callables: `traced` in the custom op's autograd (what torch.compile
    traces), `eager` in the eager Function (cross-entropy scales its saved gradient in place there)."""

    traced: Callable[..., Any]
    eager: Callable[..., Any]


@dataclass(frozen=True)
class Autograd:
    """How an op trains. With `through` (a declared backward op, Runs, or SELF), `formula` takes how to run the
    backward problem and returns the `backward(ctx, *grads)` that register_autograd takes: the custom op's backward
    runs that op's custom op, the eager Function's runs its body. Without, `formula` is the backward itself (torch
    ops), and gradients flow through the custom op (there is no eager Function)."""

    setup: SetupContext
    formula: Callable[..., Any]
    through: DeclaredOp | Runs | str | None = None


@dataclass(frozen=True)
class OpDeclaration:
    name: str  # the custom op is tunekit::<name>
    body: Callable[..., Any]
    fake: Callable[..., Any]
    autograd: Autograd | None = None


@dataclass
class DeclaredOp:
    declaration: OpDeclaration
    custom_op: CustomOpDef
    eager: type[torch.autograd.Function] | None = field(default=None)

    @cached_property
    def replayed(self) -> Callable[..., Any]:
        """The body as an eager Function runs it: through a hot-path plan. Built on first use, so an op that trains
        through its custom op alone holds no plans."""
        return hot_path(public=False)(self.declaration.body)

    def traced(self, *args: Any) -> Any:
        """The custom op as torch.compile traces it (torch.ops.tunekit.<name>)."""
        return getattr(torch.ops.tunekit, self.declaration.name)(*args)

    def run(self, *args: Any, trains: bool = False) -> Any:
        """Run the op on a front's arguments (in the custom op's schema): traced while compiling, through the
        eager Function (or the custom op's autograd) where gradients flow, else the body."""
        if torch.compiler.is_compiling():
            return self.traced(*args)
        if trains:
            return self.eager.apply(*args) if self.eager is not None else self.traced(*args)
        return self.declaration.body(*args)


def _eager_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Eager"


def declare(declaration: OpDeclaration) -> DeclaredOp:
    """Register the declaration's custom op, fake and autograd; build its eager Function."""
    custom = kernel_op(declaration.name)(declaration.body)
    custom.register_fake(declaration.fake)
    op = DeclaredOp(declaration, custom)
    grad = declaration.autograd
    if grad is None:
        return op
    if grad.through is None:
        custom.register_autograd(grad.formula, setup_context=grad.setup)
        return op
    through = op if grad.through == SELF else grad.through
    assert isinstance(through, (DeclaredOp, Runs))
    traced, eager = (through.traced, through.eager) if isinstance(through, Runs) else (through.traced, through.replayed)
    custom.register_autograd(grad.formula(traced), setup_context=grad.setup)
    backward = grad.formula(eager)
    op.eager = eager_function(_eager_name(declaration.name), op.replayed, grad.setup, backward)
    return op


# Public op name -> the declared op its front runs: what tests and tools list the ops by.
PUBLIC: dict[str, DeclaredOp] = {}


def public_op(
    torch_fallback: Callable[..., Any],
    forward: Dispatcher,
    *backward: Dispatcher,
    runs: DeclaredOp,
    screen: Screen,
    compiled_fallback: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Make a front a public op: hot-path plans per call signature, `torch_fallback` (with the front's signature)
    where dispatch serves torch, and its kernels (forward, then backward) saying which problems they may serve a
    kernel for here and whether one of them serves under torch.compile. `runs`: the declared op the front ends
    in. `screen`: which fields of the forward kernel's problem a call's arguments give (a call whose values are
    those of no problem served a kernel here is torch's own). `compiled_fallback`: what a torch.compile trace of a
    call not traced as the op becomes (`torch_fallback` if None)."""

    def wrap(front: F) -> F:
        PUBLIC[front.__name__] = runs
        served = served_by(forward, *backward)
        screened = replace(screen, kernel=forward.kernel)
        return hot_path(torch_fallback, compiled_equivalent=compiled_fallback, screen=screened, **served)(front)

    return wrap
