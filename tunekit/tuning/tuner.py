"""The tuner: one Optuna study per (kernel, device, problem), asked and told one candidate at a time.

Per candidate: constraint check (pruned before compiling) -> already measured? (answered from the record)
-> correctness on fresh random inputs with NaN-poisoned outputs -> timing. Known kernel failures (compile
errors, out of resources, interpreter errors) become recorded data and are never retried.

With isolation (the default on a GPU) candidates run in a worker subprocess (tunekit.tuning.isolation): a candidate that
hangs past `candidate_timeout_s`, kills its process or corrupts the CUDA context is one more `failed` record,
and the run goes on with a fresh worker.
"""

from __future__ import annotations

import datetime
import functools
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import optuna

from tunekit import __version__
from tunekit.core import backend
from tunekit.core.device import DeviceFingerprint
from tunekit.core.device_limits import DeviceLimits
from tunekit.core.errors import InvalidConfigError, TunekitError
from tunekit.core.space import Config, Problem, Value, config_id
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.tuning.bench import Timer, default_timer, is_builtin_timer, timer_to_json
from tunekit.tuning.candidates import TUNEKIT_ATTR, Candidates, records_from_study
from tunekit.tuning.guide import ModelGuide
from tunekit.tuning.samplers import DEFAULT_SAMPLER, make_sampler
from tunekit.tuning.storage import open_storage  # one way to open storages (journal files, sqlite locking)
from tunekit.tuning.verify import KNOWN_KERNEL_FAILURES, failure, measure

if TYPE_CHECKING:
    from tunekit.tuning.isolation import IsolatedBench

logger = logging.getLogger("tunekit")

__all__ = ["KNOWN_KERNEL_FAILURES", "TuneOptions", "TuneReport", "tune"]
_MAX_IDLE_ASKS = 16  # consecutive invalid/duplicate suggestions before we hand the sampler an unseen config
ALREADY_TUNED = "already tuned"  # the stop reason of a problem whose stored trials already reach the budget
VERSION = __version__


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 30
    timeout_s: float | None = None
    sampler: str = DEFAULT_SAMPLER
    storage: str | None = None
    seed: int = 0
    remeasure_top: int = 3
    # Benchmark in a worker subprocess. None: on for a GPU with a built-in timer, off in the interpreter (a worker
    # costs seconds to start) and for custom timers; True forces it (any timer bench.timer_to_json takes).
    isolate: bool | None = None
    # Isolated only: seconds a candidate may take (compile, verify, time) before its worker is killed.
    candidate_timeout_s: float = 120.0
    # `trials` is a per-problem budget: configs already measured for this problem (the stored entry's trials and
    # the study's) count against it, so a rerun measures only what is missing and a tuned problem measures nothing.
    # force=True makes it a per-run budget again: up to `trials` configs not measured before, whatever is stored.
    force: bool = False

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise TunekitError(f"trials must be >= 1, but got {self.trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise TunekitError(f"timeout must be > 0 seconds, but got {self.timeout_s}")
        if not self.candidate_timeout_s > 0:
            raise TunekitError(f"candidate timeout must be > 0 seconds, but got {self.candidate_timeout_s}")


@dataclass
class TuneReport:
    entry: Entry
    benchmarked: int = 0
    reused: int = 0
    pruned: int = 0
    elapsed_s: float = 0.0
    stop_reason: str = ""
    records: list[TrialRecord] = field(default_factory=list)
    isolated: bool = False
    restarts: int = 0  # isolated workers replaced after a hang, a crash or a corrupted device context
    warm_started: int = 0  # configs of related entries (another source or device) tried early
    model_pruned: int = 0  # configs the quantization model ruled out before the search
    shared_from: str | None = None  # the problem whose entry this one shares (same quantization signature)
    stored_trials: int = 0  # configs measured for this problem before this run (they count against the budget)
    budget: int = 0  # configs this run could measure: the trial budget less the stored trials (unless forced)

    @property
    def skipped(self) -> bool:
        """Already tuned to its budget: this run measured nothing and returned the stored entry."""
        return self.stop_reason == ALREADY_TUNED


class Bench(Protocol):
    """Where candidates are measured: in this process, in an isolated worker, or a simulated device.

    `measure` verifies then times a candidate (verification inputs seeded `verify_seed`); `retime` times a
    config measured before, without verifying it again.
    """

    label: str

    def measure(self, config: Config, verify_seed: int) -> TrialRecord: ...

    def retime(self, config: Config) -> TrialRecord: ...


class InProcessBench:
    """Candidates run in the tuner's own process on shared bench inputs (the interpreter and custom timers)."""

    def __init__(self, spec: KernelSpec, problem: Problem, seed: int, timer: Timer) -> None:
        self.spec = spec
        self.problem = problem
        self.timer = timer
        self.label = timer.label
        self.torch_device = backend.torch_device()
        self.inputs = spec.make_inputs(problem, self.torch_device, seed)
        self.outputs = spec.alloc_outputs(self.inputs)

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        return measure(
            self.spec, config, self.problem, self.torch_device, self.inputs, self.outputs, self.timer, verify_seed
        )

    def retime(self, config: Config) -> TrialRecord:
        try:
            ms = self.timer(functools.partial(self.spec.launch, config, self.inputs, self.outputs), config)
        except KNOWN_KERNEL_FAILURES as exc:
            return failure(config, exc)
        return TrialRecord(dict(config), "ok", time_ms=float(ms))


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

    The `model` strategy reads the quantization model (tunekit.tuning.model) with `limits` (default: the current
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
    guide = ModelGuide.make(spec, problem, device, options.sampler, limits, tuned, valid)
    if guide is not None and guide.shared is not None:
        return _shared_report(key, guide.shared, clock() - start)
    if guide is not None:
        valid = guide.kept  # best modelled first: the idle fallback follows the model
    timer_json = _isolation(options, timer)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=study_name(key, spec.problem_fields),
        storage=open_storage(options.storage) if options.storage else None,
        sampler=make_sampler(options.sampler, options.seed),
        direction="minimize",
        load_if_exists=True,
    )
    seen = Candidates(list(previous.trials if previous else ()) + records_from_study(study))
    stored = len(seen.by_id)
    budget = options.trials if options.force else max(0, options.trials - stored)
    if budget == 0 or all(c in seen for c in valid):
        # Nothing to measure (the study's stored trials reach the budget, or every valid config is measured):
        # answer from the record, without starting a bench or re-timing anything.
        reason = ALREADY_TUNED if budget == 0 else "space exhausted"
        entry = _recorded_entry(key, previous, seen, device, options, timer.label)
        if entry is None:
            raise TunekitError(
                f"every measured config of {spec.name} failed or was wrong for {spec.describe_problem(problem)}"
            )
        return TuneReport(entry=entry, stop_reason=reason, stored_trials=stored, elapsed_s=clock() - start)
    rng = random.Random(options.seed)
    unseen = [c for c in valid if c not in seen]
    if guide is None:
        rng.shuffle(unseen)  # with the model, unseen stays in modelled order: the idle fallback follows it
    allowed = {config_id(c) for c in valid}
    # The heuristic default goes first, so a tuned result is never worse than the untuned one.
    heuristic = dict(spec.heuristic(problem, device))
    queue = [heuristic] if heuristic not in seen else []
    warm = _warm_configs(spec, problem, device, [*warm_start, *(guide.nearest if guide else ())], seen, queue)
    queue += warm
    report = TuneReport(entry=None, warm_started=len(warm), stored_trials=stored, budget=budget)  # type: ignore[arg-type]  # filled below
    if guide is not None:
        report.model_pruned = guide.pruned
        queued = {config_id(c) for c in queue}
        queue += [c for c in guide.seeds if config_id(c) not in queued and c not in seen]
    allowed |= {config_id(c) for c in queue}  # the heuristic is measured even where the model would prune it
    if options.sampler == "exhaustive":
        queued = {config_id(c) for c in queue}
        queue += [c for c in unseen if config_id(c) not in queued]
    for config in queue:
        study.enqueue_trial(spec.space.encode(config), skip_if_exists=True)

    idle = 0
    n_valid = len(valid)
    owned: IsolatedBench | None = None
    if bench is None:
        if timer_json is not None:
            from tunekit.tuning.isolation import IsolatedBench

            owned = IsolatedBench(
                spec, problem, options.seed, timer_json, options.candidate_timeout_s, label=timer.label
            )
            report.isolated = True
            bench = owned
        else:
            bench = InProcessBench(spec, problem, options.seed, timer)
    active = bench

    def measure_one(config: Config) -> TrialRecord:
        return active.measure(config, rng.randrange(2**31))

    stop_requested = False  # on_trial returned True: the caller has seen enough (the efficiency benchmark)
    try:
        while True:
            if stop_requested:
                report.stop_reason = "stopped by caller"
                break
            if report.benchmarked >= budget:
                report.stop_reason = "trial budget"
                break
            if options.timeout_s is not None and clock() - start >= options.timeout_s:
                report.stop_reason = "time budget"
                break
            if sum(1 for c in valid if c in seen) >= n_valid:
                report.stop_reason = "space exhausted"
                break
            if guide is not None and not _waiting(study):
                step = guide.next_config(seen)
                if step is not None:
                    study.enqueue_trial(spec.space.encode(step))
            if idle >= _MAX_IDLE_ASKS:
                # The sampler keeps proposing invalid or measured configs: hand it an unseen valid one.
                fresh = next(c for c in unseen if c not in seen)
                study.enqueue_trial(spec.space.encode(fresh))
                idle = 0
            trial = study.ask()
            config = spec.space.suggest(trial)
            if config_id(config) not in allowed:  # breaks a rule of the space, or the model pruned it
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                report.pruned += 1
                idle += 1
                continue
            if config in seen:
                record = seen.get(config)
                report.reused += 1
                idle += 1
            else:
                record = measure_one(config)
                seen.add(record)
                report.benchmarked += 1
                report.records.append(record)
                idle = 0
                if on_trial is not None and on_trial(record, report.benchmarked):
                    stop_requested = True
                ok = seen.ok()
                if checkpoint is not None and ok:
                    # Saved after every measurement: a killed run loses at most the trial in flight.
                    checkpoint(_entry(key, ok[0], device, options, active.label, seen))
            trial.set_user_attr(TUNEKIT_ATTR, record.to_json())
            for name, value in config.items():
                # The config as the kernel sees it, one attribute per parameter: the sampler's own parameters
                # are encoded (log2_BLOCK_M=7 for BLOCK_M=128), and optuna-dashboard shows both.
                trial.set_user_attr(name, value)
            # Wrong and failed configs are told as infinitely slow, so the sampler learns to avoid their region.
            study.tell(trial, record.time_ms if record.status == "ok" else math.inf)

        best = _confirm_best(seen, options.remeasure_top, active.retime)
    finally:
        if owned is not None:
            owned.close()
            report.restarts = owned.restarts
    if best is None:
        raise TunekitError(
            f"every measured config of {spec.name} failed or was wrong for {spec.describe_problem(problem)}"
        )
    report.elapsed_s = clock() - start
    report.entry = _entry(key, best, device, options, active.label, seen)
    return report


def _waiting(study: optuna.Study) -> bool:
    """Configs enqueued and not yet asked for (the heuristic, warm starts, seeds)."""
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _shared_report(key: CacheKey, entry: Entry, elapsed_s: float) -> TuneReport:
    """A problem that quantizes exactly like a tuned one takes its entry: nothing is measured."""
    shared_from = ",".join(f"{k}={v}" for k, v in sorted(dict(entry.key.problem).items()))
    provenance = dict(entry.provenance, origin="shared", shared_from=shared_from)
    shared = replace(entry, key=key, provenance=provenance, trials=())
    return TuneReport(entry=shared, elapsed_s=elapsed_s, stop_reason="shared", shared_from=shared_from)


def _isolation(options: TuneOptions, timer: Timer) -> dict[str, Any] | None:
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


def _warm_configs(
    spec: KernelSpec,
    problem: Problem,
    device: DeviceFingerprint,
    entries: Iterable[Entry],
    seen: Candidates,
    queued: list[dict[str, Value]],
) -> list[dict[str, Value]]:
    """Best configs of related entries that are still members of the space, valid here and not yet measured."""
    picked: list[dict[str, Value]] = []
    for entry in entries:
        try:
            config = spec.space.check_membership(entry.config)
        except InvalidConfigError:
            continue  # the space changed since: not a config of this kernel any more
        if config in seen or config in queued or config in picked:
            continue
        if spec.space.is_valid(config, problem, device):
            picked.append(config)
    return picked


def _entry(
    key: CacheKey,
    best: TrialRecord,
    device: DeviceFingerprint,
    options: TuneOptions,
    timer_label: str,
    seen: Candidates,
) -> Entry:
    return Entry(
        key=key,
        config=dict(best.config),
        time_ms=float(best.time_ms or 0.0),
        device=device.to_json(),
        provenance={
            "tunekit_version": VERSION,
            "strategy": options.sampler,
            "trials": len(seen.by_id),
            "timer": timer_label,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "origin": "local",
        },
        trials=tuple(seen.by_id.values()),
    )


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
    return _entry(key, ok[0], device, options, timer_label, seen) if ok else None


def _confirm_best(seen: Candidates, top: int, retime: Callable[[Config], TrialRecord]) -> TrialRecord | None:
    """Re-measure the few fastest before declaring a winner: one lucky sample must not win.

    A contender that fails when measured again is recorded as failed and the next fastest takes its place.
    """
    ok = seen.ok()
    if not ok:
        return None
    if len(ok) == 1 or top <= 1:
        return ok[0]
    timed: list[tuple[float, TrialRecord]] = []
    for record in ok:
        if len(timed) >= top:
            break
        again = retime(record.config)
        if again.status != "ok" or again.time_ms is None:
            seen.add(TrialRecord(record.config, "failed", error=f"failed when measured again: {again.error}"))
            continue
        timed.append((min(again.time_ms, record.time_ms or again.time_ms), record))
    if not timed:
        return None
    best_time, best = min(timed, key=lambda t: t[0])
    return TrialRecord(best.config, "ok", time_ms=best_time)
