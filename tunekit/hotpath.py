"""The eager hot path: an op called again with the same call signature replays what that call did.

What an op does between its arguments and its kernel launches (validation, reshapes, the problem key, the dispatch
lookup, the grid, constexprs, Triton's argument binding and specialization) depends only on the arguments' shapes,
strides, dtypes, devices, 16-byte pointer alignment and the non-tensor arguments: the call signature. So the second
call with a signature is watched, and from then on the op is a plan:
- `Replay`: allocate what that call allocated, then fire its launches with the new tensors' pointers, straight into
  each compiled kernel's launcher (Triton's `CompiledKernel.run`, the launch entry its JIT path ends in);
- `TorchCall`: where dispatch served torch's own implementation, call torch's op directly.

A watched call that did anything else (copied, filled, computed with torch) gets no plan and keeps the full path.
The first call with a signature always takes the full path (it may tune, compile or store), and is not watched.

Only calls that need no autograd and are not being compiled take the hot path; the plans are forgotten with the
dispatch memos (`dispatch.reset_all`, `forget_memos`, `record_problems`). In Triton's interpreter (CPU) a plan
fires each launch through the interpreter, so the CPU tests exercise the same signatures, plans and bindings.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tunekit import backend, recorder

F = TypeVar("F", bound=Callable[..., Any])

_SEEN = object()  # a signature called once: the next call is watched
_NO_PLAN = object()  # a signature whose watched call did something a plan cannot replay
_ALLOCATIONS = frozenset(
    {"aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided", "aten::empty_like"}
)
_OPS: list[HotPath] = []
_MAX_SIGNATURES = 4096  # per op


@dataclass
class Stats:
    """Per op: calls served by a plan, signatures watched, plans built (re-bindings), and why some were refused."""

    replays: int = 0
    watched: int = 0
    plans: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def _tensor_part(value: torch.Tensor, pointers: list[int]) -> tuple[object, ...]:
    pointer = value.data_ptr()
    pointers.append(pointer)
    return (value.shape, value.stride(), value.dtype, value.device, pointer & 15, value.requires_grad)


def _signature(
    args: Sequence[object],
    kwargs: dict[str, object],
    tensor: type[torch.Tensor] = torch.Tensor,
    grad_enabled: Callable[[], bool] = torch.is_grad_enabled,
) -> tuple[object, ...]:
    """What the op's host work depends on. Tensors nested in containers hash by identity: such a call never repeats
    a signature (and `_MAX_SIGNATURES` bounds what it leaves behind). The defaults bind names once (hot loop)."""
    parts: list[object] = [grad_enabled()]
    append = parts.append
    pointers: list[int] = []
    for value in args:
        if isinstance(value, tensor):
            pointer = value.data_ptr()
            pointers.append(pointer)
            append((value.shape, value.stride(), value.dtype, value.device, pointer & 15, value.requires_grad))
        elif type(value) is list:
            append(tuple(value))
        else:
            append(value)
    for name, value in kwargs.items():
        append(name)
        if isinstance(value, tensor):
            append(_tensor_part(value, pointers))
        else:
            append(tuple(value) if type(value) is list else value)
    if len(pointers) > 1:  # two arguments on one pointer may be treated otherwise
        append(len(set(pointers)))
    return tuple(parts)


class HotPath:
    """An op's plans by call signature. Calling it is calling the op."""

    def __init__(self, op: Callable[..., Any], torch_equivalent: Callable[..., Any] | None) -> None:
        self.op = op
        self.torch_equivalent = torch_equivalent
        self.plans: dict[tuple[object, ...], object] = {}
        self.stats = Stats()
        functools.update_wrapper(self, op)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or recorder.ACTIVE:
            return self.op(*args, **kwargs)
        try:
            signature = _signature(args, kwargs)
            plan = self.plans.get(signature)
        except TypeError:  # an unhashable argument: the full path
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

    def _watch(self, signature: tuple[object, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from tunekit.hotpath_plan import build_plan  # the watcher and planner load on the first watched call

        self.stats.watched += 1
        if torch.is_grad_enabled() and any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in (*args, *kwargs.values())
        ):  # autograd records this call: only the full path does that
            self.stats.refused["autograd"] = self.stats.refused.get("autograd", 0) + 1
            self.plans[signature] = _NO_PLAN
            return self.op(*args, **kwargs)
        watch = Watch()
        with _on_device(args, kwargs), watch.active():
            result = self.op(*args, **kwargs)
        plan, refusal = build_plan(watch, args, kwargs, result, self.torch_equivalent)
        if plan is None:
            self.stats.refused[refusal] = self.stats.refused.get(refusal, 0) + 1
            self.plans[signature] = _NO_PLAN
        else:
            self.stats.plans += 1
            self.plans[signature] = plan
        return result

    def forget(self) -> None:
        self.plans.clear()


def hot_path(torch_equivalent: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Decorate a public op. `torch_equivalent`, with the op's signature, is what a call served TORCH becomes."""

    def wrap(op: F) -> F:
        hot = HotPath(op, torch_equivalent)
        _OPS.append(hot)
        return hot  # type: ignore[return-value]

    return wrap


def forget_plans() -> None:
    """Drop every plan: the next call of each signature takes the full path again (dispatch's reset calls this)."""
    for hot in _OPS:
        hot.forget()


def ops() -> list[HotPath]:
    return list(_OPS)


@contextmanager
def _on_device(args: Sequence[object], kwargs: dict[str, object]) -> Iterator[None]:
    """Watch on the first tensor's GPU, so the kernels compile and load for the device the plan will launch on."""
    first = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
    on_gpu = first is not None and first.device.type == "cuda"
    with torch.cuda.device(first.device) if on_gpu else nullcontext():  # type: ignore[union-attr]
        yield


# ---------------------------------------------------------------------------------------------- watching a call


@dataclass
class Launch:
    """One kernel launch as the watched call made it."""

    kernel: Any  # the JIT (or interpreted) function
    compiled: Any  # its CompiledKernel (None in the interpreter)
    grid: tuple[int, int, int]
    args: tuple[Any, ...]  # GPU: the bound arguments in signature order; interpreter: the call's positional args
    kwargs: dict[str, Any]  # interpreter only: constexprs and launch options by name


@dataclass
class Watch:
    """What a watched call did: its launches, its allocations, the torch ops it ran, whether dispatch served TORCH."""

    launches: list[Launch] = field(default_factory=list)
    allocations: list[torch.Tensor] = field(default_factory=list)
    other_ops: list[str] = field(default_factory=list)
    torch_served: bool = False
    in_launch: int = 0

    @contextmanager
    def active(self) -> Iterator[None]:
        global _WATCH
        _instrument_kernels()
        previous, _WATCH = _WATCH, self
        try:
            with _AtenWatch(self):
                yield
        finally:
            _WATCH = previous


_WATCH: Watch | None = None


def note_torch_served() -> None:
    """Dispatch served TORCH to the watched call (dispatch calls this only while a call is watched)."""
    if _WATCH is not None:
        _WATCH.torch_served = True


def watching() -> bool:
    return _WATCH is not None


class _AtenWatch(TorchDispatchMode):
    """Sees every aten op the call runs outside its launches (the interpreter's own copies are inside them)."""

    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.watch.in_launch == 0:
            name = func._schema.name
            if name in _ALLOCATIONS and isinstance(out, torch.Tensor):
                self.watch.allocations.append(out)
            elif not func.is_view and name not in ("aten::detach", "aten::alias"):
                self.watch.other_ops.append(str(func))
        return out


def _instrument_kernels() -> None:
    """Wrap `run` of every kernel in tunekit's kernel modules, once each: a watched call's launches are seen."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("tunekit.kernels") or module is None:
            continue
        for value in list(vars(module).values()):
            run = getattr(value, "run", None)
            if callable(run) and hasattr(value, "fn") and not getattr(run, "_tunekit_watched", False):
                value.run = _watched_run(value, run)


def _watched_run(kernel: Any, run: Callable[..., Any]) -> Callable[..., Any]:
    def watched(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        watch = _WATCH
        if watch is None or warmup:
            return run(*args, grid=grid, warmup=warmup, **kwargs)
        watch.in_launch += 1
        try:
            compiled = run(*args, grid=grid, warmup=warmup, **kwargs)
        finally:
            watch.in_launch -= 1
        watch.launches.append(_launch(kernel, compiled, grid, args, kwargs))
        return compiled

    watched._tunekit_watched = True  # type: ignore[attr-defined]
    return watched


def _launch(kernel: Any, compiled: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launch:
    if backend.INTERPRETED:
        dims = tuple(grid(kwargs) if callable(grid) else grid)
        return Launch(kernel, None, _three(dims), args, dict(kwargs))
    from tunekit.hotpath_plan import bound_arguments

    bound = bound_arguments(kernel, args, kwargs)
    dims = tuple(grid(bound) if callable(grid) else grid)
    return Launch(kernel, compiled, _three(dims), tuple(bound.values()), {})


def _three(dims: tuple[int, ...]) -> tuple[int, int, int]:
    padded = (*dims, 1, 1)
    return (int(padded[0]), int(padded[1]), int(padded[2]))
