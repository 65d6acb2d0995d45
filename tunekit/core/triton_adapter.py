"""Everything tunekit reads of Triton beyond its public API, in one place.

Public API, usable anywhere: `triton.jit`, `triton.autotune`, `triton.heuristics`, `triton.Config`, `triton.cdiv`,
`triton.next_power_of_2`, `triton.__version__`, `triton.language`, `triton.testing` and the host TMA descriptor of
`triton.tools.tensor_descriptor` (tests/test_layout.py holds the exact list and fails on any other import of Triton
outside this module). What follows is the rest: the driver's device properties, the JIT function's binder and `run`
entry, the compiled kernel's launcher and metadata, the launch hooks, the error classes, the cache directory.
Written against Triton 3.6; when Triton moves one of these, this module is the one to change.

Only the cheap public package is imported here at load; Triton's submodules are imported where they are used, as
the callers did before they moved here.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

from triton.compiler.errors import CompilationError
from triton.runtime.errors import InterpreterError, OutOfResources, PTXASError
from triton.runtime.jit import JITFunction, KernelInterface

__all__ = [
    "KERNEL_FAILURES",
    "CompilationError",
    "HostDescriptor",
    "InterpreterError",
    "JITFunction",
    "KernelInterface",
    "OutOfResources",
    "PTXASError",
    "arg_names",
    "bound_arguments",
    "capture_launched_kernels",
    "compile_only_when",
    "compiled_launch",
    "compiled_resources",
    "innermost_jit",
    "interpret_jit_functions",
    "is_tensor_descriptor",
    "jit_function",
    "launch_hooks_set",
    "max_shared_memory_optin",
    "python_function",
    "set_cache_dir",
    "watch_runs",
]

# What Triton raises for a config that cannot compile or launch (a failed trial, not a bug).
KERNEL_FAILURES: tuple[type[BaseException], ...] = (CompilationError, OutOfResources, PTXASError, InterpreterError)

Launcher = Callable[[list[Any], int], None]  # (the launch arguments in signature order, the raw CUDA stream)


# --- the device ------------------------------------------------------------------------------------------------


def max_shared_memory_optin(index: int) -> int:
    """The opt-in shared memory per block of CUDA device `index`, as Triton's driver reports it."""
    import triton

    return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


def set_cache_dir(path: str) -> None:
    """Point Triton's compilation cache (in this process and the processes it starts) at `path`."""
    os.environ["TRITON_CACHE_DIR"] = path


# --- JIT functions ---------------------------------------------------------------------------------------------


def jit_function(obj: Any) -> Any | None:
    """The Python function a jit function (GPU or interpreter) or a jit wrapper holds as `.fn`; None for anything
    that is no KernelInterface."""
    return getattr(obj, "fn", None) if isinstance(obj, KernelInterface) else None


def python_function(fn: Any) -> Any:
    """The Python function under a jit function, through wrappers that hold it as `.fn` (triton.heuristics)."""
    while not isinstance(fn, types.FunctionType) and hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def innermost_jit(fn: Any) -> Any:
    """The jit function under wrappers (triton.heuristics): the last object whose `.fn` is a plain function."""
    inner = fn
    while hasattr(inner, "fn") and not isinstance(inner.fn, types.FunctionType):
        inner = inner.fn
    return inner


def arg_names(fn: Any) -> list[str] | None:
    """A jit function's argument names in signature order; None when `fn` is no jit function."""
    if not isinstance(fn, KernelInterface) or not hasattr(fn, "arg_names"):
        return None
    return list(fn.arg_names)


def watch_runs(kernel: Any, wrap: Callable[[Any, Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace a jit function's launch entry `run(*args, grid, warmup, **kwargs)` by `wrap(kernel, run)`, once:
    objects that are no jit function, and a `run` already wrapped, are left alone."""
    run = getattr(kernel, "run", None)
    if callable(run) and hasattr(kernel, "fn") and not getattr(run, "_tunekit_watched", False):
        watched = wrap(kernel, run)
        watched._tunekit_watched = True  # type: ignore[attr-defined]
        kernel.run = watched


class _InterpretedJit(JITFunction):  # type: ignore[type-arg]
    """A jit function built for the GPU that Triton's interpreter runs: launches and calls from interpreted kernels go
    to the InterpretedFunction `triton.jit` would have built. Adds no slots, so an existing JITFunction can become
    one in place."""

    __slots__ = ()

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return self._interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._interpreted(*args, **kwargs)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        # A tensor method (`x.max(axis=0)`): the interpreter's tl.tensor forwards to the free function the same way.
        return self if obj is None else functools.partial(self._interpreted, obj)


def interpret_jit_functions() -> int:
    """Make every jit function built for the GPU run in the interpreter instead, in place (every reference to it sees
    the change); returns how many. `triton.jit` picks the interpreter when it decorates, so the functions made before
    TRITON_INTERPRET was set (Triton's own tl.max, tl.sum, ... when triton was imported before tunekit on a machine
    without a GPU) raise "Cannot call @triton.jit'd outside of the scope of a kernel" when an interpreted kernel
    calls them."""
    import gc

    from triton.runtime.interpreter import InterpretedFunction

    built = [obj for obj in gc.get_objects() if type(obj) is JITFunction]
    for obj in built:
        obj._interpreted = InterpretedFunction(
            obj.fn,
            version=obj.version,
            do_not_specialize=obj.do_not_specialize,
            do_not_specialize_on_alignment=obj.do_not_specialize_on_alignment,
            debug=obj.debug,
            noinline=obj.noinline,
            repr=obj._repr,
            launch_metadata=obj.launch_metadata,
        )  # as triton.jit builds it under TRITON_INTERPRET
        obj.__class__ = _InterpretedJit
    return len(built)


def compile_only_when(compile_only: Callable[[], bool]) -> None:
    """Make every JITFunction launch compile without launching (Triton's warmup) while `compile_only()` is true
    (a compiling thread's launches: tunekit/tuning/precompile.py). Patches the class once."""
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return original(self, *args, grid=grid, warmup=warmup or compile_only(), **kwargs)

    JITFunction.run = run


def bound_arguments(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments in the kernel's signature order, as Triton's JIT path passes them to the compiled launcher."""
    from triton import knobs
    from triton.runtime.driver import driver

    binder = kernel.device_caches[driver.active.get_current_device()][4]
    options = dict(kwargs)
    options["debug"] = options.get("debug", kernel.debug) or knobs.runtime.debug
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, _, _ = binder(*args, **options)
    return dict(bound)


def launch_hooks_set() -> bool:
    """Whether a Triton launch hook (enter or exit) is set and would be called."""
    from triton import knobs

    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(h is not None and getattr(h, "calls", True) for h in hooks)


# --- compiled kernels ------------------------------------------------------------------------------------------


class HostDescriptor:
    """What the launcher reads of a host TMA descriptor (Triton's class re-validates alignment on every call)."""

    __slots__ = ("base", "block_shape", "padding", "shape", "strides")

    def __init__(self, base: Any, shape: list[int], strides: list[int], block: list[int], pad: str) -> None:
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block, pad


def is_tensor_descriptor(value: Any) -> bool:
    """A host TMA descriptor (triton.tools.tensor_descriptor.TensorDescriptor) passed as a launch argument."""
    return type(value).__name__ == "TensorDescriptor"


def compiled_launch(compiled: Any, grid: tuple[int, int, int], direct: bool = True) -> Launcher:
    """A compiled kernel's launch with Triton's JIT path left out: `launch(values, stream)`. Straight into the
    compiled launch entry where the kernel needs no scratch memory (and `direct`), else through the launcher object,
    which allocates the kernel's scratch memory per launch."""
    gx, gy, gz = grid
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    raw = getattr(run, "launch", None)
    if not direct or raw is None or run.global_scratch_size or run.profile_scratch_size:

        def through_launcher(values: list[Any], stream: int) -> None:
            run(gx, gy, gz, stream, function, packed, None, None, None, *values)

        return through_launcher
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

    # What Triton 3.6's CudaLauncher.__call__ ends in, no scratch.
    def direct_launch(values: list[Any], stream: int) -> None:
        raw(gx, gy, gz, stream, function, cooperative, pdl, None, None, packed, None, None, None, *values)

    return direct_launch


@contextlib.contextmanager
def capture_launched_kernels() -> Iterator[list[Any]]:
    """Every Triton CompiledKernel launched inside the block (their registers, spills and shared memory)."""
    from triton.compiler.compiler import CompiledKernel

    launched: list[Any] = []
    original = CompiledKernel.launch_metadata

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        launched.append(self)
        return original(self, *args, **kwargs)

    CompiledKernel.launch_metadata = spy
    try:
        yield launched
    finally:
        CompiledKernel.launch_metadata = original


def compiled_resources(kernel: Any) -> tuple[int, int, int]:
    """(registers per thread, spilled registers, shared memory bytes) of a CompiledKernel."""
    return int(kernel.n_regs), int(kernel.n_spills), int(kernel.metadata.shared)
