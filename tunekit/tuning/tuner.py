"""The tuner: one Optuna study per (kernel, device, problem), asked and told one candidate at a time.

Per candidate: constraint check (pruned before compiling) -> already measured? (answered from the record)
-> correctness on fresh random inputs with NaN-poisoned outputs -> timing. Known kernel failures (compile
errors, out of resources, interpreter errors) become recorded data and are never retried.

With isolation (the default on a GPU) candidates run in a worker subprocess (tunekit.tuning.isolation): a candidate that
hangs past `candidate_timeout_s`, kills its process or corrupts the CUDA context is one more `failed` record,
and the run goes on with a fresh worker.

This module sets a run up (the study, the bench, what is already measured) and finishes it (the best confirmed, the
entry); the search loop itself is tunekit.tuning.search, the options and report tunekit.tuning.tune_types.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import optuna

from tunekit.core import backend
from tunekit.core.device import DeviceFingerprint
from tunekit.core.device_limits import DeviceLimits
from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.tuning.bench import Timer, default_timer, is_builtin_timer, timer_to_json
from tunekit.tuning.candidates import Candidates, confirm_best, records_from_study
from tunekit.tuning.guide import ModelGuide
from tunekit.tuning.samplers import make_sampler
from tunekit.tuning.search import Search, tuned_entry
from tunekit.tuning.storage import open_storage  # one way to open storages (journal files, sqlite locking)
from tunekit.tuning.torch_candidate import candidate_time
from tunekit.tuning.tune_types import ALREADY_TUNED, Bench, TuneOptions, TuneReport
from tunekit.tuning.verify import InProcessBench

if TYPE_CHECKING:
    from tunekit.tuning.isolation import IsolatedBench


def study_name(key: CacheKey, fields: Sequence[str] = ()) -> str:
    """The Optuna study of one problem, readable in optuna-dashboard: kernel and problem first (in `fields` order,
    the spec's), then the device and kernel-source digests that keep it unique:
    `tunekit layernorm rows=4096 cols=4097 dtype=float16 weight=True bias=True | device ca96.. | source f76f..`."""
    problem = dict(key.problem)
    order = [f for f in fields if f in problem] + sorted(f for f in problem if f not in fields)
    text = " ".join(f"{name}={problem[name]}" for name in order)
    return f"tunekit {key.kernel} {text} | device {key.device_key} | source {key.source_hash}"


def tune(
    spec: KernelSpec,
    problem: Problem,
    device: DeviceFingerprint,
    options: TuneOptions | None = None,
    *,
    timer: Timer | None = None,
    previous: Entry | None = None,
    on_trial: Callable[[TrialRecord, int], bool | None] | None = None,
    checkpoint: Callable[[Entry], object] | None = None,
    warm_start: Iterable[Entry] = (),
    bench: Bench | None = None,
    clock: Callable[[], float] | None = None,
    limits: DeviceLimits | None = None,
    tuned: Iterable[Entry] = (),
) -> TuneReport:
    """Search `spec`'s space for `problem` on `device`.

    `previous` (a cached entry) supplies trials already measured; `checkpoint` receives the entry so far after
    every new measurement (the CLI stores it); `warm_start` entries (the same problem tuned for another kernel
    source or device, `Store.related`) have their best configs measured early, right after the heuristic.
    `on_trial(record, n)` sees every new measurement; returning True ends the search there.
    `bench` replaces where candidates run (the caller owns and closes it; tunekit.evaluation.simulate passes a recorded
    device) and `clock` what the time budget reads (a simulated clock there).

    The `model` strategy reads the quantization model (tunekit.tuning.perf_model) with `limits` (default: the current
    GPU's): it prunes configs that cannot launch or are hopeless, measures the top-modelled configs first, and
    uses `tuned` (entries of other problems of this kernel, source and device): a problem with the same
    quantization signature shares that entry without measuring anything, else the nearest tuned problem's best
    configs are measured early.
    """
    options = options or TuneOptions()
    timer = timer or default_timer()
    clock = clock or time.monotonic
    start = clock()
    key = CacheKey.make(spec.name, spec.source_hash, device.key, problem)
    if previous is not None and not options.force and len(previous.trials) >= options.trials:
        # Tuned to its budget: nothing is compiled, measured or even enumerated.
        return TuneReport(entry=previous, stop_reason=ALREADY_TUNED, stored_trials=len(previous.trials))
    valid = spec.space.valid_configs(problem, device)
    if not valid:
        raise TunekitError(f"no config of {spec.name}'s space is valid for {spec.describe_problem(problem)}")
    guide = ModelGuide.make(spec, problem, device, options.sampler, limits, tuned, valid, options.ranker)
    if guide is not None and guide.shared is not None:
        return _shared_report(key, guide.shared, clock() - start)
    if guide is not None:
        valid = guide.kept  # best modelled first: the idle fallback follows the model
    timer_json = isolated_timer(options, timer)

    study = _open_study(key, spec, options)
    seen = Candidates(list(previous.trials if previous else ()) + records_from_study(study))
    stored = len(seen.by_id)
    budget = options.trials if options.force else max(0, options.trials - stored)
    if budget == 0 or all(c in seen for c in valid):
        # Nothing to measure (the study's stored trials reach the budget, or every valid config is measured):
        # answer from the record, without starting a bench or re-timing anything.
        reason = ALREADY_TUNED if budget == 0 else "space exhausted"
        entry = _recorded_entry(key, previous, seen, device, options, timer.label)
        if entry is None:
            raise _all_failed(spec, problem)
        return TuneReport(entry=entry, stop_reason=reason, stored_trials=stored, elapsed_s=clock() - start)
    rng = random.Random(options.seed)
    search = Search(spec, problem, device, options, key, study, seen, valid, guide, budget, rng)
    search.report.stored_trials = stored
    search.enqueue_first([*warm_start, *(guide.nearest if guide else ())])
    supplied = bench
    owned, bench = _bench_for(search, bench, timer, timer_json)
    try:
        search.run(bench, clock, start, on_trial, checkpoint)
        best = confirm_best(seen, options.remeasure_top, bench.retime)
        torch_ms = candidate_time(spec, problem, options.seed, timer, supplied) if best is not None else None
    finally:
        if owned is not None:
            owned.close()
            search.report.restarts = owned.restarts
    if best is None:
        raise _all_failed(spec, problem)
    search.report.elapsed_s = clock() - start
    search.report.entry = tuned_entry(key, best, device, options, bench.label, seen, torch_ms)
    return search.report


def _all_failed(spec: KernelSpec, problem: Problem) -> TunekitError:
    what = spec.describe_problem(problem)
    return TunekitError(f"every measured config of {spec.name} failed or was wrong for {what}")


def _open_study(key: CacheKey, spec: KernelSpec, options: TuneOptions) -> optuna.Study:
    """The problem's study: in `options.storage` when given (resumed where a run left off), else in memory."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=study_name(key, spec.problem_fields),
        storage=open_storage(options.storage) if options.storage else None,
        sampler=make_sampler(options.sampler, options.seed),
        direction="minimize",
        load_if_exists=True,
    )


def _bench_for(
    search: Search, bench: Bench | None, timer: Timer, timer_json: dict[str, Any] | None
) -> tuple[IsolatedBench | None, Bench]:
    """The caller's bench, else one of ours (returned first too: ours to close): isolated or in this process."""
    if bench is not None:
        return None, bench
    if timer_json is None:
        return None, InProcessBench(search.spec, search.problem, search.options.seed, timer)
    from tunekit.tuning.isolation import IsolatedBench

    owned = IsolatedBench(
        search.spec,
        search.problem,
        search.options.seed,
        timer_json,
        search.options.candidate_timeout_s,
        label=timer.label,
    )
    search.report.isolated = True
    return owned, owned


def _shared_report(key: CacheKey, entry: Entry, elapsed_s: float) -> TuneReport:
    """A problem that quantizes exactly like a tuned one takes its entry: nothing is measured."""
    shared_from = ",".join(f"{k}={v}" for k, v in sorted(dict(entry.key.problem).items()))
    provenance = dict(entry.provenance, origin="shared", shared_from=shared_from)
    shared = replace(entry, key=key, provenance=provenance, trials=())
    return TuneReport(entry=shared, elapsed_s=elapsed_s, stop_reason="shared", shared_from=shared_from)


def isolated_timer(options: TuneOptions, timer: Timer) -> dict[str, Any] | None:
    """The timer as the worker rebuilds it when this run is isolated, else None (measure in this process)."""
    if options.isolate is False:
        return None
    if options.isolate is None and (backend.INTERPRETED or not is_builtin_timer(timer)):
        return None
    described = timer_to_json(timer)
    if described is None:
        raise TunekitError(
            f"isolate=True needs a timer the worker process can rebuild (a module-level class with JSON "
            f"attributes), but got {type(timer).__qualname__}; use isolate=False for this timer"
        )
    return described


def _recorded_entry(
    key: CacheKey,
    previous: Entry | None,
    seen: Candidates,
    device: DeviceFingerprint,
    options: TuneOptions,
    timer_label: str,
) -> Entry | None:
    """The entry the record alone gives (nothing measured in this run): the stored entry, whose best was confirmed
    when it was tuned, with the study's trials added; else the fastest recorded config. None when none is ok."""
    if previous is not None:
        return replace(previous, trials=tuple(seen.by_id.values()))
    ok = seen.ok()
    return tuned_entry(key, ok[0], device, options, timer_label, seen) if ok else None
