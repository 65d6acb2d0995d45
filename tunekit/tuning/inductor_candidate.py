"""What Inductor generates for a problem, as a candidate: torch's op for the problem compiled by torch.compile and
timed like a config, its time kept with the entry (`INDUCTOR_MS`).

Under torch.compile a kernel serves a problem only where it beats this time (tunekit/runtime/compile_policy.py):
torch's eager time says nothing there, since Inductor fuses a norm's or an epilogue's elementwise work into its own
kernels. Timed alone, the candidate does not see the neighbours Inductor may also fuse in a model, so the model
step decides last (tests/gpu/compile_transfer.py). Compiling costs seconds per problem, so it is timed for tuned
entries that serve a kernel eagerly, on request (`mark_under_compile`), not during every search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import torch

from tunekit.core import backend
from tunekit.core.device import DeviceFingerprint
from tunekit.core.registry import get_spec
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import INDUCTOR_MS, Entry
from tunekit.store.store import Store
from tunekit.tuning.bench import Timer

INDUCTOR_CANDIDATE = {"implementation": "inductor"}  # what a timer is told it times


def time_inductor(spec: KernelSpec, problem: Problem, seed: int, timer: Timer) -> float | None:
    """Inductor's time for `problem`: the kernel's `torch_baseline` compiled for its inputs (static shapes), with
    `timer`. None without a baseline, in the interpreter, or where compiling or running it fails."""
    baseline = spec.torch_baseline
    if baseline is None or backend.INTERPRETED:
        return None
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)
    compiled = torch.compile(baseline, dynamic=False)
    try:
        compiled(inputs)  # compile outside the timing
        return float(timer(lambda: compiled(inputs), dict(INDUCTOR_CANDIDATE)))
    except Exception:  # Inductor failing on a problem: no candidate, the kernel is not chosen
        return None


def mark_under_compile(
    store: Store,
    device: DeviceFingerprint,
    serves_kernel: Callable[[KernelSpec, Entry], bool],
    timer: Timer,
    kernels: Iterable[str] | None = None,
    seed: int = 0,
) -> list[Entry]:
    """Time Inductor's candidate for every entry of this device that serves a kernel eagerly (`serves_kernel`,
    dispatch's rule) and has no Inductor time yet; store it with the entry. Returns the entries updated."""
    wanted = None if kernels is None else set(kernels)
    updated = []
    for entry in store.entries():
        spec_name, problem = entry.key.kernel, dict(entry.key.problem)
        if entry.key.device_key != device.key or (wanted is not None and spec_name not in wanted):
            continue
        spec = get_spec(spec_name)
        if INDUCTOR_MS in entry.provenance or entry.key.source_hash != spec.source_hash:
            continue
        if not serves_kernel(spec, entry):
            continue
        ms = time_inductor(spec, problem, seed, timer)
        if ms is not None:
            updated.append(store.put(replace(entry, provenance={**entry.provenance, INDUCTOR_MS: round(ms, 6)})))
    return updated
