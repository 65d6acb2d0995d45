"""The nearest tuned problem: what serves an untuned problem in the interpreter (dispatch) and what the tuner's
`model` strategy warm-starts from."""

from __future__ import annotations

import math
from collections.abc import Iterable

from tunekit.core.device import DeviceFingerprint
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import Entry


def problem_distance(a: Problem, b: Problem) -> float:
    """inf unless every non-numeric field matches; else the summed log2 distance of the numeric fields."""
    total = 0.0
    for name, va in a.items():
        vb = b[name]
        if isinstance(va, (bool, str)) or isinstance(vb, (bool, str)):
            if va != vb:
                return math.inf
        else:
            total += abs(math.log2(max(int(va), 1)) - math.log2(max(int(vb), 1)))
    return total


def nearest_entry(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, candidates: Iterable[Entry]
) -> Entry | None:
    """The closest tuned problem of the same kernel, source and device whose config is valid here."""
    scope = (spec.name, spec.source_hash, device.key)
    ranked = sorted(
        ((problem_distance(problem, dict(e.key.problem)), e.key.digest, e) for e in candidates if e.key.scope == scope),
        key=lambda t: (t[0], t[1]),  # digest breaks ties: every rank resolves the same way
    )
    for distance, _, entry in ranked:
        if math.isfinite(distance) and spec.space.is_valid(entry.config, problem, device):
            return entry
    return None
