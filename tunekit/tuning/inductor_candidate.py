"""A problem timed under torch.compile: the entry's kernel as Inductor builds it, against torch's op for the
problem compiled (what Inductor generates), both kept with the entry (`under_compile_*` fields).

Under compile a kernel serves a problem only where it wins this comparison (tunekit/runtime/compile_policy.py).
Neither eager time says anything there: Inductor fuses a norm's or an epilogue's elementwise work into its own
kernels, and it builds a user's Triton kernel itself, which can run slower than Triton's own build of the same
config. Timed alone, neither side sees the neighbours Inductor may fuse in a model, so the model step decides last
(tests/gpu/compile_transfer.py). Compiling costs seconds per problem: it runs on request (`mark_under_compile`)
for tuned entries that serve a kernel eagerly, not during every search.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping

import torch

from tunekit.core import backend
from tunekit.core.device import DeviceFingerprint
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, Problem
from tunekit.core.spec import Inputs, KernelSpec
from tunekit.launch import watch as launch_watch
from tunekit.launch.traced import traced_pointers
from tunekit.store.entry import Entry, under_compile_record, with_under_compile
from tunekit.store.store import Store
from tunekit.tuning.bench import Timer

INDUCTOR_CANDIDATE = {"implementation": "inductor"}  # what a timer is told it times
_PROBES: dict[str, tuple[KernelSpec, Config, Inputs]] = {}
_PROBE_IDS = itertools.count()


@torch.library.triton_op("tunekit::compiled_launch", mutates_args=())
def _compiled_launch(tensors: list[torch.Tensor], probe: str) -> list[torch.Tensor]:
    """One launch of a probe's kernel and config on `tensors` (its inputs' tensors, in order): traced, it becomes
    the graph's kernel node, which Inductor builds and launches as it would in a model."""
    spec, config, template = _PROBES[probe]
    given = iter(tensors)
    inputs = tuple(next(given) if isinstance(v, torch.Tensor) else v for v in template)
    outputs = spec.alloc_outputs(inputs)
    launch_watch.instrument_kernels()
    with traced_pointers():
        spec.launch(config, inputs, outputs)
    return list(outputs)


def _timed_compiled(fn: Callable[[], object], timer: Timer, what: Mapping[str, int | str | bool]) -> float | None:
    try:
        fn()  # compile outside the timing
        return float(timer(fn, what))
    except Exception:  # Inductor failing on a problem: no time, so the kernel is not chosen under compile
        return None


def time_compiled_kernel(spec: KernelSpec, problem: Problem, config: Config, seed: int, timer: Timer) -> float | None:
    """The kernel with `config` on `problem`, launched from an Inductor-compiled graph."""
    if backend.INTERPRETED:
        return None
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)
    probe = f"{spec.name}:{next(_PROBE_IDS)}"
    _PROBES[probe] = (spec, config, inputs)
    tensors = [v for v in inputs if isinstance(v, torch.Tensor)]
    compiled = torch.compile(lambda ts: torch.ops.tunekit.compiled_launch(ts, probe), dynamic=False)
    try:
        return _timed_compiled(lambda: compiled(tensors), timer, dict(config))
    finally:
        del _PROBES[probe]


def time_inductor(spec: KernelSpec, problem: Problem, seed: int, timer: Timer) -> float | None:
    """torch's op for `problem` (the kernel's `torch_baseline`) compiled by torch.compile, static shapes."""
    baseline = spec.torch_baseline
    if baseline is None or backend.INTERPRETED:
        return None
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)
    compiled = torch.compile(baseline, dynamic=False)
    return _timed_compiled(lambda: compiled(inputs), timer, dict(INDUCTOR_CANDIDATE))


def mark_under_compile(
    store: Store,
    device: DeviceFingerprint,
    serves_kernel: Callable[[KernelSpec, Entry], bool],
    timer: Timer,
    kernels: Iterable[str] | None = None,
    seed: int = 0,
) -> list[Entry]:
    """Time every entry of this device that serves a kernel eagerly (`serves_kernel`: dispatch's rule) and has no
    time under compile yet, both ways; store the times with the entry. Returns the entries updated."""
    wanted = None if kernels is None else set(kernels)
    updated = []
    for entry in store.entries():
        if entry.key.device_key != device.key or (wanted is not None and entry.key.kernel not in wanted):
            continue
        spec = get_spec(entry.key.kernel)
        fresh = entry.key.source_hash == spec.source_hash and under_compile_record(entry.provenance) is None
        if not fresh or not serves_kernel(spec, entry):
            continue
        problem = dict(entry.key.problem)
        torch._dynamo.reset()  # each probe compiles anew: no recompile limit across problems
        kernel_ms = time_compiled_kernel(spec, problem, entry.config, seed, timer)
        inductor_ms = time_inductor(spec, problem, seed, timer)
        if kernel_ms is None or inductor_ms is None:
            continue
        record = {"kernel_ms": round(kernel_ms, 6), "inductor_ms": round(inductor_ms, 6)}
        updated.append(store.put(with_under_compile(entry, record)))
    return updated
