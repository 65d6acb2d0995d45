"""The eager hot path: an op called again with the same call signature replays what that call did.

What an op does between its arguments and its kernel launches (validation, reshapes, the problem key, the dispatch
lookup, the grid, constexprs, Triton's argument binding and specialization) depends only on the arguments' shapes,
strides, dtypes, devices, 16-byte pointer alignment and the non-tensor arguments: the call signature. So the second
call with a signature is watched, and from then on the op is a plan:
- `Replay`: allocate what that call allocated, then fire its launches with the new tensors' pointers, straight into
  each compiled kernel's launcher (Triton's `CompiledKernel.run`, the launch entry its JIT path ends in);
- `TorchCall`: where dispatch served torch's own implementation, call torch's op directly.

Before any signature, two checks send a call straight to torch's op: every problem of the op's kernels is torch's
on this device (no entry that serves a kernel), or, for a call that needs no autograd, its `Screen` value (exact
fields of the forward kernel's problem, read from the arguments) is that of no problem an entry serves a kernel for.

A watched call that did anything else (copied, filled, computed with torch) gets no plan and keeps the full path.
The first call with a signature always takes the full path (it may tune, compile or store), and is not watched.

Only calls that need no autograd and are not being compiled take the hot path; the plans are forgotten with the
dispatch memos (`dispatch.reset_all`, `forget_memos`, `record_problems`). In Triton's interpreter (CPU) a plan
fires each launch through the interpreter, so the CPU tests exercise the same signatures, plans and bindings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor

from tunekit.core.errors import InvalidInputError
from tunekit.core.space import Problem
from tunekit.launch.plan import TorchCall, build_plan, call_signature
from tunekit.launch.watch import Watch, watching
from tunekit.runtime import compile_policy, recorder
from tunekit.runtime.eager_autograd import runs_tunekit_backward

F = TypeVar("F", bound=Callable[..., Any])

_SEEN = object()  # a signature called once: the next call is watched
_NO_PLAN = object()  # a signature whose watched call did something a plan cannot replay
_OPS: list[HotPath] = []
_INNER: list[HotPath] = []  # ops' inner steps (hot_path(public=False))
_MAX_SIGNATURES = 4096  # per op
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
# Replaced whenever the plans and the served-problem decisions are forgotten: a key that holds it (a patched
# module's, tunekit.nn.torch_call_key) holds a decision of this epoch, and no copy or pickle of it ever matches.
EPOCH = object()


@dataclass
class Stats:
    """Per op: calls served by a plan, signatures watched, plans built (re-bindings), and why some were refused."""

    replays: int = 0
    torch_direct: int = 0  # calls passed straight to torch: no kernel of the op can serve on this device
    watched: int = 0
    plans: int = 0
    refused: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Screen:
    """A necessary condition for a call without autograd to be served a kernel, cheaper than its signature: the
    call's value of some fields of the forward kernel's problem (`of_call`, with the op's signature) is that of a
    problem an entry serves a kernel for here. A field whose entries serve a range of its values (GEMM's token
    count m, served from the bucket edge above it) is compared coarsened: `coarsened` maps it to the function
    that `of_call` applies to the call's value too. `of_call` returning None, or raising, leaves the call to the
    full path."""

    of_call: Callable[..., object]
    fields: tuple[str, ...]  # one field: its value; more: the tuple of their values
    kernel: str = ""  # the forward kernel (public_op names it)
    coarsened: tuple[tuple[str, Callable[[Any], object]], ...] = ()

    def of_problem(self, problem: Problem) -> object:
        coarse = dict(self.coarsened)
        values = tuple(coarse[f](problem[f]) if f in coarse else problem[f] for f in self.fields)
        return values[0] if len(values) == 1 else values


def _any_requires_grad(args: Sequence[object], kwargs: dict[str, object]) -> bool:
    for value in args:
        if isinstance(value, Tensor) and value.requires_grad:
            return True
    return bool(kwargs) and any(isinstance(v, Tensor) and v.requires_grad for v in kwargs.values())


def readable(value: object) -> object:
    """A tensor argument as a kernel may read its memory: torch's negative and conjugate bits resolved (a copy
    holding the values the view means), anything but plain strided storage refused; other values as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.layout != torch.strided or value.is_nested:
        kind = "a nested tensor" if value.is_nested else f"layout {value.layout}"
        raise InvalidInputError(f"tensor arguments must be strided (torch.strided), but got {kind}")
    if value.is_neg() or value.is_conj():
        return value.resolve_neg().resolve_conj()
    return value


def _readable_arguments(op: Callable[..., Any]) -> Callable[..., Any]:
    """`op` on its arguments as `readable` makes them (the op's full path; a plan's signature holds the bits)."""

    @functools.wraps(op)
    def call(*args: Any, **kwargs: Any) -> Any:
        return op(*map(readable, args), **{name: readable(value) for name, value in kwargs.items()})

    return call


class HotPath:
    """An op's plans by call signature. Calling it is calling the op."""

    def __init__(
        self,
        op: Callable[..., Any],
        torch_equivalent: Callable[..., Any] | None,
        served_problems: Callable[[], tuple[Sequence[Problem], Sequence[Problem]] | None] | None = None,
        screen: Screen | None = None,
        chosen_under_compile: Callable[[], bool] | None = None,
        public: bool = True,
        compiled_equivalent: Callable[..., Any] | None = None,
    ) -> None:
        self.public = public  # a public op, not an op's inner step (hot_path(public=False))
        self.traced = op  # what torch.compile traces (Dynamo cannot trace the bit tests; the launch resolves them)
        self.op = _readable_arguments(op)
        self.torch_equivalent = torch_equivalent
        # what a torch.compile trace of a call not traced as tunekit's op becomes (torch's code, by default)
        self.compiled_equivalent = compiled_equivalent or torch_equivalent
        # (problems of all the op's kernels, of its forward kernel) that dispatch may serve a kernel for; None:
        # any problem may be served one (the interpreter, a policy that serves untuned problems a kernel)
        self.served_problems = served_problems
        self.screen = screen
        self.only_torch: bool | None = None  # decided on the first call, again after `forget`
        self.screened: Collection[object] | None = None  # the screen values that may be served a kernel; with it
        self.chosen_under_compile = chosen_under_compile
        self.compile_chosen: bool | None = None  # decided when first traced, again after `forget`
        self.plans: dict[tuple[object, ...], object] = {}
        self.stats = Stats()
        self.name = op.__name__
        functools.update_wrapper(self, op)

    def _decide(self) -> bool:
        """Whether torch serves every call here; sets the screen's values for the rest."""
        served = self.served_problems() if self.served_problems is not None else None
        if served is None:
            self.screened = None
            self.only_torch = False
            return False
        every, forward = served
        screen = self.screen
        self.screened = frozenset(screen.of_problem(p) for p in forward) if screen is not None else None
        self.only_torch = not every
        return self.only_torch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The order is the cost order of a call torch serves: each check is a few attribute reads, and the screen
        # (one problem's fields) runs only where some problem of the op is served a kernel here.
        if _is_compiling():
            return self._traced_call(args, kwargs)
        if recorder.ACTIVE or watching():  # diverted(), inline on every op call: a recording or a watched call
            return self.op(*args, **kwargs)
        only_torch = self.only_torch
        if only_torch is None:
            only_torch = self._decide()
        if only_torch:  # torch serves every problem of this op here: no signature, no key, torch's own call
            self.stats.torch_direct += 1
            return self.torch_equivalent(*args, **kwargs)  # type: ignore[misc]
        screened = self.screened
        if screened is not None:
            try:
                value = self.screen.of_call(*args, **kwargs)  # type: ignore[union-attr]
            except Exception:  # arguments the op refuses: its full path says why
                value = None
            if (
                value is not None
                and value not in screened
                and not (_grad_enabled() and _any_requires_grad(args, kwargs))
            ):
                self.stats.torch_direct += 1  # no entry serves a kernel for a problem of this size
                return self.torch_equivalent(*args, **kwargs)  # type: ignore[misc]
        try:
            signature = call_signature(args, kwargs)
            plan = self.plans.get(signature)
        except (TypeError, RuntimeError):  # an unhashable argument, a tensor without a data pointer: the full path
            return self.op(*args, **kwargs)
        if plan is None:
            if len(self.plans) >= _MAX_SIGNATURES:  # shapes that never repeat: start over rather than grow
                self.plans.clear()
            self.plans[signature] = _SEEN
            return self.op(*args, **kwargs)
        if plan is _NO_PLAN:
            return self.op(*args, **kwargs)
        if plan is _SEEN:
            return self._watch(signature, args, kwargs)
        self.stats.replays += 1
        return plan(args, kwargs)  # type: ignore[operator]

    def _traced_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The graph holds torch's own ops, which Inductor fuses with their neighbours, unless a kernel of this
        # op beats Inductor's code for some problem (compile_policy): then the op itself, whose body decides per
        # problem when traced. A recording traces the op itself, so that its problems are recorded.
        if recorder.ACTIVE or self.torch_equivalent is None or traces_op(self.name):
            return self.traced(*args, **kwargs)
        return self.compiled_equivalent(*args, **kwargs)  # type: ignore[misc]

    def _watch(self, signature: tuple[object, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.stats.watched += 1
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        autograd = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        watch = Watch()
        with _on_device(args, kwargs):
            with watch.active():
                result = self.op(*args, **kwargs)
            # On the call's GPU: the plan launches on the device its kernels were loaded on.
            plan, refusal = build_plan(watch, args, kwargs, result, self.torch_equivalent)
        # A call autograd records may only become torch's own op (which records itself), and only where the full
        # path ran torch's alone: a replay records nothing, and a tunekit backward must stay a tunekit backward.
        if autograd and (not isinstance(plan, TorchCall) or runs_tunekit_backward(result, tensors)):
            plan, refusal = None, "autograd"
        if plan is None:
            self.stats.refused[refusal] = self.stats.refused.get(refusal, 0) + 1
            self.plans[signature] = _NO_PLAN
        else:
            self.stats.plans += 1
            self.plans[signature] = plan
        return result

    def forget(self) -> None:
        self.plans.clear()
        self.only_torch = None
        self.screened = None
        self.compile_chosen = None


def hot_path(
    torch_equivalent: Callable[..., Any] | None = None,
    *,
    public: bool = True,
    served_problems: Callable[[], tuple[Sequence[Problem], Sequence[Problem]] | None] | None = None,
    screen: Screen | None = None,
    chosen_under_compile: Callable[[], bool] | None = None,
    compiled_equivalent: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Decorate a public op. `torch_equivalent`, with the op's signature, is what a call served TORCH becomes.
    `served_problems()`: the problems dispatch may serve a kernel for on this device, of all the op's kernels
    (forward and backward) and of its forward kernel (None: any problem may be); where there is none, every call
    is torch's own, with no per-call work of tunekit's, and `screen` sends others there by size.
    public=False: an op's inner step (the body its eager autograd Function runs forward or backward), replayed
    the same way but not listed among the ops."""

    def wrap(op: F) -> F:
        hot = HotPath(op, torch_equivalent, served_problems, screen, chosen_under_compile, public, compiled_equivalent)
        (_OPS if public else _INNER).append(hot)
        return hot  # type: ignore[return-value]

    return wrap


def _measured_swap(name: str) -> bool:
    """Whether op `name` traces as itself under compile by measurement; a constant to Dynamo (it reads the store)."""
    hot = op_named(name)
    if hot.compile_chosen is None:
        hot.compile_chosen = hot.chosen_under_compile is not None and hot.chosen_under_compile()
    return hot.compile_chosen


@torch._dynamo.assume_constant_result
def traces_op(name: str) -> bool:
    """Whether a torch.compile graph calls op `name` as tunekit's op (whose body picks kernel or torch code per
    problem), not as torch's own code: as TUNEKIT_COMPILE_OPS forces, else as measured (compile_policy). A
    constant to Dynamo, with no guard on the policy: changing the policy means compiling again."""
    forced = compile_policy.forced(name)
    return _measured_swap(name) if forced is None else forced


def traces_as_model_code(op_name: str) -> bool:
    """Being compiled, and op `op_name` not traced as tunekit's: a patched module (or RoPE function) then runs the
    model's own code, so the compiled graph is the one compile alone would build."""
    return torch.compiler.is_compiling() and not traces_op(op_name)


def forget_plans() -> None:
    """Drop every plan: the next call of each signature takes the full path again (dispatch's reset calls this)."""
    global EPOCH
    EPOCH = object()
    for hot in (*_OPS, *_INNER):
        hot.forget()


def diverted() -> bool:
    """A recording or a watched call is on: every op call takes its full path."""
    return bool(recorder.ACTIVE) or watching()


def op_named(name: str) -> HotPath:
    return next(h for h in _OPS if h.name == name)


def ops() -> list[HotPath]:
    return list(_OPS)


@contextmanager
def _on_device(args: Sequence[object], kwargs: dict[str, object]) -> Iterator[None]:
    """Watch on the first tensor's GPU, so the kernels compile and load for the device the plan will launch on."""
    first = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
    on_gpu = first is not None and first.device.type == "cuda"
    with torch.cuda.device(first.device) if on_gpu else nullcontext():  # type: ignore[union-attr]
        yield
