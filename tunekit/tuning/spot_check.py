"""One stored config measured here, with torch's op beside it: what the runtime asks of the tuning layer when it must
trust an entry recorded elsewhere (tunekit.runtime.version_policy: an entry recorded under another Triton)."""

from __future__ import annotations

from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TrialRecord


def measure_here(spec: KernelSpec, problem: Problem, config: Config, seed: int = 0) -> tuple[TrialRecord, float | None]:
    """`config` compiled, verified against the reference and timed on this device (as the tuner measures a
    candidate), and torch's time for the problem (None in the interpreter or without a baseline). Run with no
    autograd and no autocast, whatever the caller's context: either would change what the reference computes."""
    import torch

    from tunekit.core import backend
    from tunekit.tuning.bench import default_timer
    from tunekit.tuning.torch_candidate import time_torch
    from tunekit.tuning.verify import measure

    timer = default_timer()
    where = backend.torch_device()
    with torch.no_grad(), torch.autocast(where.type, enabled=False):
        inputs = spec.make_inputs(problem, where, seed)
        outputs = spec.alloc_outputs(inputs)
        record = measure(spec, config, problem, where, inputs, outputs, timer, seed + 1)
        torch_ms = None if backend.INTERPRETED else time_torch(spec, problem, seed, timer)
    return record, torch_ms
