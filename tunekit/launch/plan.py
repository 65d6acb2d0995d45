"""Plans built from a watched call: what a later call with the same signature runs instead (the eager hot path,
tunekit/runtime/hotpath.py), and what the tuner times a candidate through.

A plan refers to tensors by source: the call's tensor arguments first (by position or keyword), then the tensors
the watched call allocated. Every tensor a launch received is found by pointer inside one source (at an offset
when it was a view that moved the pointer); a launch argument found nowhere, or a result that is none of the
sources, refuses the plan. Scalars, grids and constexprs are constants of the signature. Plans fire without
Triton's launch hooks: none is built while a hook is set, and a hook set later is not called for existing plans
(`reset_all` drops them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tunekit.core import backend
from tunekit.core.triton_adapter import HostDescriptor, compiled_launch, is_tensor_descriptor, launch_hooks_set
from tunekit.launch.watch import Launch, Watch

# A source reference: ("src", index) is the source tensor itself; ("ptr", index, offset) its pointer plus offset
# bytes; ("desc", index, shape, strides, block_shape, padding) a TMA descriptor over it.
Ref = tuple[Any, ...]


class NoPlan(Exception):
    """Why a watched call cannot be replayed (the message is the refusal counted in `Stats.refused`)."""


@dataclass(frozen=True)
class _Slot:
    positional: bool
    key: int | str


class _Sources:
    """The call's tensors and the watched call's allocations, searchable by pointer."""

    def __init__(self, args: Sequence[Any], kwargs: dict[str, Any], allocations: list[torch.Tensor]) -> None:
        self.slots = [_Slot(True, i) for i, v in enumerate(args) if isinstance(v, torch.Tensor)]
        self.slots += [_Slot(False, k) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        tensors = [args[s.key] if s.positional else kwargs[s.key] for s in self.slots]  # type: ignore[index]
        self.tensors: list[torch.Tensor] = tensors + allocations
        self.allocations = [(tuple(t.shape), t.stride(), t.dtype, t.device) for t in allocations]

    def _span(self, t: torch.Tensor) -> tuple[int, int]:
        start = t.data_ptr()
        size = int(t.untyped_storage().nbytes()) - int(t.storage_offset()) * t.element_size()
        return start, start + max(size, 1)

    def find(self, pointer: int) -> tuple[int, int]:
        """(source index, byte offset) of the one source holding `pointer`."""
        hits = []
        for i, t in enumerate(self.tensors):
            if t.numel() == 0:  # no memory (often a null pointer): nothing a launch can address
                continue
            start, end = self._span(t)
            if start <= pointer < end:
                hits.append((i, pointer - start))
        exact = [h for h in hits if h[1] == 0]
        if len(exact) == 1:
            return exact[0]
        if len(hits) == 1:
            return hits[0]
        raise NoPlan("a launch argument is in no single source" if not hits else "overlapping sources")

    def ref(self, value: Any) -> Ref | None:
        """How a launch argument is found again; None for a constant."""
        if isinstance(value, torch.Tensor):
            index, offset = self.find(value.data_ptr())
            if offset == 0:
                return ("src", index)
            if backend.INTERPRETED:
                raise NoPlan("an offset pointer in the interpreter")
            return ("ptr", index, offset)
        if is_tensor_descriptor(value):
            index, offset = self.find(value.base.data_ptr())
            if offset:
                raise NoPlan("a TMA descriptor not at a source's start")
            return ("desc", index, list(value.shape), list(value.strides), list(value.block_shape), value.padding)
        if isinstance(value, (bool, float, str, type(None), torch.dtype)):
            return None
        if isinstance(value, int):
            if any(start <= value < end for start, end in map(self._span, self.tensors) if start):
                raise NoPlan("an integer argument that looks like a pointer")
            return None
        raise NoPlan(f"a launch argument of type {type(value).__name__}")


def _resolve(ref: Ref, tensors: list[torch.Tensor]) -> Any:
    kind = ref[0]
    if kind == "src":
        return tensors[ref[1]]
    if kind == "ptr":
        return tensors[ref[1]].data_ptr() + ref[2]
    return HostDescriptor(tensors[ref[1]], ref[2], ref[3], ref[4], ref[5])


@dataclass
class _Fire:
    """One launch of a plan: constant arguments with the tensor ones substituted per call."""

    launch: Callable[[list[Any], int], None]
    template: list[Any]
    refs: list[tuple[int, Ref]]

    def values(self, tensors: list[torch.Tensor]) -> list[Any]:
        values = list(self.template)
        for position, ref in self.refs:
            values[position] = _resolve(ref, tensors)
        return values

    def __call__(self, tensors: list[torch.Tensor], stream: int) -> None:
        self.launch(self.values(tensors), stream)


def _fire(launch: Launch, sources: _Sources) -> _Fire:
    refs = [(i, r) for i, value in enumerate(launch.args) if (r := sources.ref(value)) is not None]
    template = list(launch.args)
    if backend.INTERPRETED:
        kernel, grid, kwargs = launch.kernel, launch.grid, launch.kwargs

        def interpret(values: list[Any], stream: int) -> None:
            kernel[grid](*values, **kwargs)

        return _Fire(interpret, template, refs)
    return _Fire(compiled_launch(launch.compiled, launch.grid), template, refs)


def _result_ref(result: Any, sources: _Sources) -> Any:
    """The result as references to sources: ("tensor", index, shape, stride, offset, same) or containers of them."""
    if isinstance(result, torch.Tensor) and result.numel() == 0:
        return ("empty", tuple(result.shape), result.stride(), result.dtype, result.device)
    if isinstance(result, torch.Tensor):
        index, offset = sources.find(result.data_ptr())
        source = sources.tensors[index]
        if source.dtype != result.dtype or offset % result.element_size():
            raise NoPlan("a result that reinterprets a source")
        same = offset == 0 and source.shape == result.shape and source.stride() == result.stride()
        return ("tensor", index, tuple(result.shape), result.stride(), offset // result.element_size(), same)
    if isinstance(result, tuple):
        return ("tuple", type(result), [_result_ref(r, sources) for r in result])
    if result is None or isinstance(result, (bool, int, float)):
        return ("constant", result)
    raise NoPlan(f"a result of type {type(result).__name__}")


def _build_result(ref: Any, tensors: list[torch.Tensor]) -> Any:
    kind = ref[0]
    if kind == "tensor":
        _, index, shape, stride, offset, same = ref
        source = tensors[index]
        return source if same else source.as_strided(shape, stride, source.storage_offset() + offset)
    if kind == "empty":
        return torch.empty_strided(ref[1], ref[2], dtype=ref[3], device=ref[4])
    if kind == "tuple":
        items = [_build_result(r, tensors) for r in ref[2]]
        return tuple(items) if ref[1] is tuple else ref[1](items)
    return ref[1]


def _raw_stream(device: int) -> int:
    """The device's current CUDA stream as Triton's launcher takes it (a capture stream while graphs record)."""
    return int(torch._C._cuda_getCurrentRawStream(device))


def call_signature(
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
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, tensor):
            pointer = value.data_ptr()
            pointers.append(pointer)
            # The negative and conjugate bits: memory holds other values than the tensor means (a plan built for a
            # plain tensor must never read such a view raw).
            append(
                (
                    value.shape,
                    value.stride(),
                    value.dtype,
                    value.device,
                    pointer & 15,
                    value.requires_grad,
                    value.is_neg(),
                    value.is_conj(),
                )
            )
        elif type(value) is list:
            append(tuple(value))
        else:
            append(value)
    if kwargs:
        append(tuple(kwargs))
    if len(pointers) > 1:  # two arguments on one pointer may be treated otherwise
        append(len(set(pointers)))
    return tuple(parts)


@dataclass
class Replay:
    """Allocate what the watched call allocated, fire its launches on the current stream, build its result."""

    slots: list[_Slot]
    allocations: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device] | None]
    fires: list[_Fire]
    result: Any
    device: int | None  # the GPU the kernels were loaded on (None: the interpreter)

    def _tensors(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The sources: the call's tensors, then fresh allocations (None where nothing launched reads one)."""
        tensors: list[Any] = [args[s.key] if s.positional else kwargs[s.key] for s in self.slots]  # type: ignore[index]
        for a in self.allocations:
            tensors.append(None if a is None else torch.empty_strided(a[0], a[1], dtype=a[2], device=a[3]))
        return tensors

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        tensors = self._tensors(args, kwargs)
        if self.device is None:
            for fire in self.fires:
                fire(tensors, 0)
        elif torch._C._cuda_getDevice() == self.device:
            stream = _raw_stream(self.device)
            for fire in self.fires:
                fire(tensors, stream)
        else:  # a call for another GPU than the current one: its kernels, its current stream
            with torch.cuda.device(self.device):
                stream = _raw_stream(self.device)
                for fire in self.fires:
                    fire(tensors, stream)
        return _build_result(self.result, tensors)

    def prepared(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], None]:
        """The plan's launches for these arguments with every argument resolved (for timing the launch floor)."""
        tensors = self._tensors(args, kwargs)
        stream = 0 if self.device is None else _raw_stream(self.device)
        ready = [(fire.launch, fire.values(tensors)) for fire in self.fires]

        def launch_all() -> None:
            for launch, values in ready:
                launch(values, stream)

        return launch_all


@dataclass
class TorchCall:
    """Dispatch served torch's own implementation: call it, with nothing of tunekit's around it."""

    torch_equivalent: Callable[..., Any]

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.torch_equivalent(*args, **kwargs)


def _hooks_set() -> bool:
    return not backend.INTERPRETED and launch_hooks_set()


def build_plan(
    watch: Watch,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result: Any,
    torch_equivalent: Callable[..., Any] | None,
) -> tuple[Replay | TorchCall | None, str]:
    """(the plan, "") or (None, why not)."""
    if watch.torch_served:
        if watch.launches or torch_equivalent is None:
            return None, "torch served part of the call"
        return TorchCall(torch_equivalent), ""
    if watch.other_ops:
        return None, f"the call ran {watch.other_ops[0]}"
    if _hooks_set():
        return None, "Triton launch hooks are set"
    try:
        sources = _Sources(args, kwargs, watch.allocations)
        fires = [_fire(launch, sources) for launch in watch.launches]
        result_ref = _result_ref(result, sources)
    except NoPlan as refusal:
        return None, str(refusal)
    device = None if backend.INTERPRETED else torch.cuda.current_device()
    used = {ref[1] for fire in fires for _, ref in fire.refs} | set(_result_sources(result_ref))
    first = len(sources.slots)
    allocations = [a if first + i in used else None for i, a in enumerate(sources.allocations)]
    return Replay(sources.slots, allocations, fires, result_ref, device), ""


def _result_sources(ref: Any) -> list[int]:
    if ref[0] == "tensor":
        return [ref[1]]
    if ref[0] == "tuple":
        return [i for r in ref[2] for i in _result_sources(r)]
    return []
