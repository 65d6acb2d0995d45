"""Watching one call: the kernel launches it made (through tunekit's own JIT functions, whose `run` is wrapped
once), the tensors it allocated and the other torch ops it ran (through a TorchDispatchMode), and whether dispatch
served it torch's own implementation. The eager hot path (tunekit/runtime/hotpath.py) builds its plans from it, and
the tuner times a candidate through the same plan (tunekit/tuning/verify.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tunekit.core import backend
from tunekit.core.triton_adapter import bound_arguments, watch_runs
from tunekit.launch.traced import is_traced, traced_launch

_ALLOCATIONS = frozenset(
    {"aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided", "aten::empty_like"}
)


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
        instrument_kernels()
        previous, _WATCH = _WATCH, self
        try:
            with _AtenWatch(self):
                yield
        finally:
            _WATCH = previous


_WATCH: Watch | None = None


def note_torch_served() -> None:
    """Torch served the watched call: dispatch served TORCH, or an op ran torch's own formula for the whole call (a
    no-op unless a call is watched)."""
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


def instrument_kernels() -> None:
    """Wrap `run` of every kernel in tunekit's kernel modules, once each: a watched call's launches are seen, and
    a traced one's recorded (tunekit/launch/traced.py)."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("tunekit.kernels") or module is None:
            continue
        for value in list(vars(module).values()):
            watch_runs(value, _watched_run)


def _watched_run(kernel: Any, run: Callable[..., Any]) -> Callable[..., Any]:
    def watched(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if is_traced(args, kwargs):  # torch.compile tracing an op: the launch becomes a node of the graph
            return traced_launch(kernel, grid, args, kwargs)
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

    return watched


def _launch(kernel: Any, compiled: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launch:
    if backend.INTERPRETED:
        dims = tuple(grid(kwargs) if callable(grid) else grid)
        return Launch(kernel, None, _three(dims), args, dict(kwargs))
    bound = bound_arguments(kernel, args, kwargs)
    dims = tuple(grid(bound) if callable(grid) else grid)
    return Launch(kernel, compiled, _three(dims), tuple(bound.values()), {})


def _three(dims: tuple[int, ...]) -> tuple[int, int, int]:
    padded = (*dims, 1, 1)
    return (int(padded[0]), int(padded[1]), int(padded[2]))
