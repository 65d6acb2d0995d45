"""A kernel launch made while torch.compile traces an op: recorded in the graph as a Triton kernel call.

tunekit's ops are `torch.library.triton_op`s. When torch.compile traces one, its body runs on fake (or functional)
tensors and every launch it makes becomes a node of torch's Triton-kernel higher-order op (the `wrap_triton`
mechanism), which Inductor compiles and launches itself: the compiled graph holds the kernel, with the config the
body chose at trace time, and no per-call Python dispatch of tunekit's. The kernels' launch code stays as it is
(their identities, so their tuned entries, do not change): the launch watch (tunekit/launch/watch.py), which
already wraps each kernel's `run`, sends a launch here when its arguments are being traced.

In Triton's interpreter (the CPU tests) `@triton.jit` makes an InterpretedFunction, which torch's tracer does not
take: it gets a JITFunction twin over the same Python function, whose launch runs the interpreted kernel. So the
CPU tests trace, compile (aot_eager) and run the same graphs a GPU does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from tunekit.core.triton_adapter import JITFunction

_TWINS: dict[int, Any] = {}
_TRACED_TYPES = (FakeTensor, FunctionalTensor)


def _offset_pointer(t: torch.Tensor) -> int:
    """A traced tensor's pointer as Inductor assumes it: its storage 16-byte aligned (the allocator's; Inductor
    checks graph inputs at run time), plus the view's offset."""
    return int(t.storage_offset()) * t.element_size()


@contextmanager
def traced_pointers() -> Iterator[None]:
    """Inside, a traced tensor's data_ptr() is `_offset_pointer`: the host code of a key or launch that checks
    pointer alignment (TMA, vector widths) decides as it would for the real tensors, instead of failing."""
    saved = [(cls, cls.__dict__.get("data_ptr")) for cls in _TRACED_TYPES]
    for cls in _TRACED_TYPES:
        cls.data_ptr = _offset_pointer  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        for cls, method in saved:
            if method is None:
                delattr(cls, "data_ptr")
            else:
                cls.data_ptr = method  # type: ignore[method-assign]


def is_traced(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A launch whose tensors are being traced (fake or functional): it must become a graph node, not run.
    Checked on the first tensor argument (a launch mixes no real and traced tensors)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return isinstance(value, _TRACED_TYPES)
    return False


def traced_launch(kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Record `kernel[grid](*args, **kwargs)` as a node of torch's Triton-kernel op in the graph being traced."""
    from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper

    jit = _jit_of(kernel)
    jit.tunekit_grid = grid  # the interpreter's write probe launches with it (`_written_by_interpreted`)
    wrapper = TraceableTritonKernelWrapper(jit, None, grid)
    _hopifier().call_triton_kernel(wrapper, args, kwargs, None)


@functools.cache
def _hopifier() -> Any:
    """torch's tracer of Triton kernel calls, taking host-side TMA descriptors too. torch's own (for wrap_triton)
    records none (a descriptor of a fake tensor then fails in Inductor), while its Dynamo path records them as
    their tensor and block shape ("stable" metadata), from which Inductor makes the descriptor at run time. A
    descriptor here becomes the same: its tensor viewed with the descriptor's shape and strides, and its block."""
    from torch._higher_order_ops.triton_kernel_wrap import (
        TracingTritonHOPifier,
        create_tma_stable_metadata,
        triton_kernel_wrapper_mutation,
    )
    from triton.tools.tensor_descriptor import TensorDescriptor

    class DescriptorTracingHOPifier(TracingTritonHOPifier):
        def call_HOP(self, variable: Any, grids: Any, combined_args: dict[str, Any], tx: None) -> Any:
            args, tma = dict(combined_args), dict[str, Any]()
            for name, value in combined_args.items():
                if isinstance(value, TensorDescriptor):
                    args[name] = value.base.as_strided(list(value.shape), list(value.strides))
                    tma[name] = create_tma_stable_metadata(list(value.block_shape))
            graphable, constant_args_idx = self.store_non_graphable_args(args)
            return triton_kernel_wrapper_mutation(
                kernel_idx=variable.kernel_idx,
                constant_args_idx=constant_args_idx,
                grid=grids,
                tma_descriptor_metadata=tma,
                kwargs=graphable,
            )

    return DescriptorTracingHOPifier()


def _jit_of(kernel: Any) -> Any:
    if isinstance(kernel, JITFunction):
        return kernel
    twin = _TWINS.get(id(kernel))
    if twin is None:
        twin = _TWINS[id(kernel)] = _interpreted_twin(kernel)
    return twin


def _interpreted_twin(interpreted: Any) -> Any:
    """A JITFunction over an InterpretedFunction's Python function that launches the interpreted kernel."""
    from torch._higher_order_ops import triton_kernel_wrap

    if not getattr(triton_kernel_wrap.get_mutated_tensors, "tunekit_probe", False):
        triton_kernel_wrap.get_mutated_tensors = _written_by_interpreted(triton_kernel_wrap.get_mutated_tensors)

    class InterpretedTwin(JITFunction):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            return interpreted[grid](*args, **kwargs)

    twin = InterpretedTwin(interpreted.fn)
    twin.tunekit_interpreted = interpreted
    # Triton hashes a JITFunction's source and the jit functions it calls; those are interpreted here, which its
    # hash refuses. The twin stands for one interpreted kernel: its identity is enough.
    twin.hash = f"interpreted:{interpreted.fn.__module__}.{interpreted.fn.__qualname__}:{id(interpreted)}"
    return twin


def _written_by_interpreted(find_written: Any) -> Any:
    """torch's finder of the arguments a kernel writes, which reads the kernel's compiled IR; for an interpreted
    twin, which has none, the arguments a probe launch writes: the interpreted kernel run once, with the traced
    launch's grid, on real random tensors of the traced ones' sizes and strides, compared before and after.
    (torch would otherwise take every argument as written: a read-only weight would then be copied back into the
    parameter, which a training graph cannot do.)"""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch.utils._python_dispatch import _disable_current_modes

    def written(kernel_idx: int, constant_args_idx: int, kwargs: dict[str, Any], tma: Any) -> list[str]:
        kernel: Any = kernel_side_table.get_kernel(kernel_idx)
        while not hasattr(kernel, "tunekit_interpreted") and hasattr(kernel, "fn"):  # torch's one-config autotuner
            kernel = kernel.fn
        interpreted = getattr(kernel, "tunekit_interpreted", None)
        if interpreted is None:
            return list(find_written(kernel_idx, constant_args_idx, kwargs, tma))
        constants = kernel_side_table.get_constant_args(constant_args_idx)
        with _disable_current_modes():
            real = {n: _real_like(v) if isinstance(v, torch.Tensor) else v for n, v in kwargs.items()}
            before = {n: v.clone() for n, v in real.items() if isinstance(v, torch.Tensor)}
            grid = kernel.tunekit_grid
            grid = grid({**real, **constants}) if callable(grid) else grid
            interpreted[grid](**real, **constants)
            return [n for n, v in before.items() if not torch.equal(v, real[n])]

    written.tunekit_probe = True  # type: ignore[attr-defined]
    return written


def _real_like(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with t's sizes, strides, offset and dtype, filled with random values (integers: zeros, which
    index anything)."""
    offset = int(t.storage_offset())
    span = offset + sum((int(n) - 1) * int(s) for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else offset
    base = torch.zeros(max(span, 1), dtype=t.dtype)
    if t.dtype.is_floating_point:
        base.normal_()
    shape, stride = [int(n) for n in t.shape], [int(s) for s in t.stride()]
    return base.as_strided(shape, stride, offset)
