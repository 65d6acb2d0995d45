"""Tune one problem against a store, the one way every caller does it (`tunekit tune`, fleet workers, dispatch's
tune-on-miss): load what the store knows (the problem's own entry, its related entries for a warm start, the
kernel's tuned problems for the `model` strategy), tune, store the result.

The runtime reaches the tuning layer through this module only (tests/test_layout.py checks).
"""

from __future__ import annotations

from collections.abc import Callable

from tunekit.core.device import DeviceFingerprint
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.store.store import Store
from tunekit.tuning.bench import Timer
from tunekit.tuning.tune_types import Bench, TuneOptions, TuneReport
from tunekit.tuning.tuner import tune

__all__ = ["TuneOptions", "TuneReport", "tune_and_store"]


def tune_and_store(
    spec: KernelSpec,
    problem: Problem,
    device: DeviceFingerprint,
    options: TuneOptions,
    store: Store | None,
    *,
    put: Callable[[Entry], Entry] | None = None,
    timer: Timer | None = None,
    bench: Bench | None = None,
    on_trial: Callable[[TrialRecord, int], bool | None] | None = None,
) -> tuple[Entry, TuneReport]:
    """Tune `problem` with what `store` knows and store the winner; returns the stored entry and the report.

    `put` stores an entry (default `store.put`; None and no store: nothing is stored). It also checkpoints the
    entry so far after every measurement, so a killed run loses at most the trial in flight. A problem already
    tuned to its budget returns its stored entry, not stored again.
    """
    keep = put if put is not None else (store.put if store is not None else None)
    previous: Entry | None = None
    related: list[Entry] = []
    tuned: list[Entry] = []
    if store is not None:
        key = CacheKey.make(spec.name, spec.source_hash, device.key, problem)
        previous = store.get(key)
        related = store.related(key)
        tuned = [e for e in store.entries() if e.key.scope == key.scope]
    report = tune(
        spec, problem, device, options, timer=timer, previous=previous, warm_start=related, tuned=tuned,
        on_trial=on_trial, checkpoint=keep, bench=bench
    )  # fmt: skip
    if report.skipped or keep is None:
        return report.entry, report
    return keep(report.entry), report
