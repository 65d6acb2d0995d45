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
from tunekit.store.entry import TORCH_MS, Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.tuning.bench import Timer, default_timer, is_builtin_timer, timer_to_json
from tunekit.tuning.candidates import TUNEKIT_ATTR, Candidates, confirm_best, records_from_study
from tunekit.tuning.early_stop import STOP_REASON as EARLY_STOP_REASON
from tunekit.tuning.guide import ModelGuide
from tunekit.tuning.ranker import Ranker
from tunekit.tuning.samplers import DEFAULT_SAMPLER, make_sampler
from tunekit.tuning.storage import open_storage  # one way to open storages (journal files, sqlite locking)
from tunekit.tuning.torch_candidate import candidate_time
from tunekit.tuning.verify import KNOWN_KERNEL_FAILURES, InProcessBench

if TYPE_CHECKING:
    from tunekit.tuning.isolation import IsolatedBench

logger = logging.getLogger("tunekit")

__all__ = ["KNOWN_KERNEL_FAILURES", "InProcessBench", "TuneOptions", "TuneReport", "tune"]
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
    # The `model` strategy's learned ranking correction (tunekit.tuning.ranker); None: the shipped one. The
    # efficiency benchmark passes one fitted without the table it scores (leave-one-shape-out).
    ranker: Ranker | None = None
    # The model's early stop (tunekit.tuning.early_stop): the relative timing noise (0.03: 3%) within which a config
    # the model says is left cannot beat the incumbent, ending the search. None: search to the trial budget.
    early_stop: float | None = None
    # Threads compiling the search's first configs (the heuristic, the model's picks, warm starts) before any is
    # measured (tunekit.tuning.precompile); 0: each compiles at its first launch.
    precompile_threads: int = 0

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise TunekitError(f"trials must be >= 1, but got {self.trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise TunekitError(f"timeout must be > 0 seconds, but got {self.timeout_s}")
        if self.early_stop is not None and not 0 <= self.early_stop < 1:
            raise TunekitError(f"early stop noise must be in [0, 1), but got {self.early_stop}")
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
    phases: dict[str, float] = field(default_factory=dict)  # seconds by phase (tunekit.tuning.phases), when timed

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
    timer_json = _isolation(options, timer)

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
    search = _Search(spec, problem, device, options, key, study, seen, valid, guide, budget, rng)
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
    search.report.entry = _entry(key, best, device, options, bench.label, seen, torch_ms)
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
    search: _Search, bench: Bench | None, timer: Timer, timer_json: dict[str, Any] | None
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


class _Search:
    """One problem's search loop over an Optuna study: what is queued, allowed and measured, and the report."""

    def __init__(
        self,
        spec: KernelSpec,
        problem: Problem,
        device: DeviceFingerprint,
        options: TuneOptions,
        key: CacheKey,
        study: optuna.Study,
        seen: Candidates,
        valid: list[dict[str, Value]],
        guide: ModelGuide | None,
        budget: int,
        rng: random.Random,
    ) -> None:
        self.spec, self.problem, self.device, self.options, self.key = spec, problem, device, options, key
        self.study, self.seen, self.valid, self.guide, self.budget, self.rng = study, seen, valid, guide, budget, rng
        self.unseen = [c for c in valid if c not in seen]
        if guide is None:
            rng.shuffle(self.unseen)  # with the model, unseen stays in modelled order: the idle fallback follows it
        self.allowed = {config_id(c) for c in valid}
        self.report = TuneReport(entry=None, budget=budget)  # type: ignore[arg-type]  # filled by tune()
        self.idle = 0
        self.first: list[dict[str, Value]] = []

    def enqueue_first(self, related: list[Entry]) -> None:
        """What an untuned problem is served first (the ranker's pick where one is fitted, then the heuristic
        default: a tuned result is never worse than the untuned one), then the related entries' best configs,
        the model's seeds, and with the exhaustive strategy every unseen config."""
        spec, seen, guide = self.spec, self.seen, self.guide
        untuned = [dict(spec.heuristic(self.problem, self.device))]
        if guide is not None and guide.first is not None:
            untuned.insert(0, guide.first)
        queue: list[dict[str, Value]] = []
        for config in untuned:
            if config not in seen and config not in queue:
                queue.append(config)
        warm = _warm_configs(spec, self.problem, self.device, related, seen, queue)
        queue += warm
        self.report.warm_started = len(warm)
        if guide is not None:
            self.report.model_pruned = guide.pruned
            queued = {config_id(c) for c in queue}
            queue += [c for c in guide.seeds if config_id(c) not in queued and c not in seen]
        self.allowed |= {config_id(c) for c in queue}  # the heuristic is measured even where the model would prune it
        if self.options.sampler == "exhaustive":
            queued = {config_id(c) for c in queue}
            queue += [c for c in self.unseen if config_id(c) not in queued]
        self.first = queue  # measured first, in this order: what precompile_threads compiles ahead
        for config in queue:
            self.study.enqueue_trial(spec.space.encode(config), skip_if_exists=True)

    def stop_reason(self, clock: Callable[[], float], start: float) -> str | None:
        if self.report.benchmarked >= self.budget:
            return "trial budget"
        if self.options.timeout_s is not None and clock() - start >= self.options.timeout_s:
            return "time budget"
        if sum(1 for c in self.valid if c in self.seen) >= len(self.valid):
            return "space exhausted"
        noise = self.options.early_stop
        if noise is not None and self.guide is not None and self.guide.nothing_left_to_gain(self.seen, noise):
            return EARLY_STOP_REASON
        return None

    def run(
        self,
        bench: Bench,
        clock: Callable[[], float],
        start: float,
        on_trial: Callable[[TrialRecord, int], bool | None] | None,
        checkpoint: Callable[[Entry], object] | None,
    ) -> None:
        """Ask, check, measure (or answer from the record) and tell, until a budget or the space runs out."""
        if self.options.precompile_threads > 0 and hasattr(bench, "precompile"):
            bench.precompile(self.first[: self.budget], self.options.precompile_threads)  # compiled ahead, in parallel
        stop_requested = False  # on_trial returned True: the caller has seen enough (the efficiency benchmark)
        while True:
            reason = "stopped by caller" if stop_requested else self.stop_reason(clock, start)
            if reason is not None:
                self.report.stop_reason = reason
                return
            trial = self._next_trial()
            config = self.spec.space.suggest(trial)
            if config_id(config) not in self.allowed:  # breaks a rule of the space, or the model pruned it
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                self.report.pruned += 1
                self.idle += 1
                continue
            if config in self.seen:
                record = self.seen.get(config)
                self.report.reused += 1
                self.idle += 1
            else:
                record = bench.measure(config, self.rng.randrange(2**31))
                self.seen.add(record)
                self.report.benchmarked += 1
                self.report.records.append(record)
                self.idle = 0
                if on_trial is not None and on_trial(record, self.report.benchmarked):
                    stop_requested = True
                ok = self.seen.ok()
                if checkpoint is not None and ok:
                    # Saved after every measurement: a killed run loses at most the trial in flight.
                    checkpoint(_entry(self.key, ok[0], self.device, self.options, bench.label, self.seen))
            self._tell(trial, config, record)

    def _next_trial(self) -> optuna.trial.Trial:
        """The next trial to ask for, after queueing the model's next step or, when the sampler keeps proposing
        invalid or measured configs, an unseen valid one."""
        study, space = self.study, self.spec.space
        if self.guide is not None and not _waiting(study):
            step = self.guide.next_config(self.seen)
            if step is not None:
                study.enqueue_trial(space.encode(step))
        if self.idle >= _MAX_IDLE_ASKS:
            fresh = next(c for c in self.unseen if c not in self.seen)
            study.enqueue_trial(space.encode(fresh))
            self.idle = 0
        return study.ask()

    def _tell(self, trial: optuna.trial.Trial, config: Config, record: TrialRecord) -> None:
        trial.set_user_attr(TUNEKIT_ATTR, record.to_json())
        for name, value in config.items():
            # The config as the kernel sees it, one attribute per parameter: the sampler's own parameters
            # are encoded (log2_BLOCK_M=7 for BLOCK_M=128), and optuna-dashboard shows both.
            trial.set_user_attr(name, value)
        # Wrong and failed configs are told as infinitely slow, so the sampler learns to avoid their region.
        self.study.tell(trial, record.time_ms if record.status == "ok" else math.inf)


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
    torch_ms: float | None = None,
) -> Entry:
    measured_torch = {} if torch_ms is None else {TORCH_MS: round(torch_ms, 6)}
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
            **measured_torch,
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
