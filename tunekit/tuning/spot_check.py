"""One stored config checked, or measured with torch's op beside it, here: what the runtime asks of the tuning layer
when it must trust an entry recorded elsewhere (tunekit.runtime.version_policy: an import, a shipped database or
pack, an entry recorded under another Triton)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def check_here(spec: KernelSpec, problem: Problem, config: Mapping[str, Any], seed: int = 0) -> str | None:
    """`config` run once on fresh inputs with its outputs poisoned and compared with the reference (what the tuner
    checks of every candidate): None when correct, else why not. No autograd and no autocast, as `measure_here`."""
    import torch

    from tunekit.core import backend
    from tunekit.tuning.verify import verify_config

    where = backend.torch_device()
    with torch.no_grad(), torch.autocast(where.type, enabled=False):
        return verify_config(spec, dict(config), problem, where, seed)
