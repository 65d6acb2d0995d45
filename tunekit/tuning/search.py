"""One problem's search loop over an Optuna study (the tuner's inner loop, tunekit.tuning.tuner sets it up): what is
queued first, what the sampler may propose, each candidate measured or answered from the record, and the entry the
measurements give."""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Callable, Iterable

import optuna

from tunekit import __version__
from tunekit.core.device import DeviceFingerprint
from tunekit.core.errors import InvalidConfigError
from tunekit.core.space import Config, Problem, Value, config_id
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TORCH_MS, Entry, TrialRecord
from tunekit.store.key import CacheKey
from tunekit.tuning.candidates import TUNEKIT_ATTR, Candidates
from tunekit.tuning.early_stop import STOP_REASON as EARLY_STOP_REASON
from tunekit.tuning.guide import ModelGuide
from tunekit.tuning.tune_types import Bench, TuneOptions, TuneReport

_MAX_IDLE_ASKS = 16  # consecutive invalid/duplicate suggestions before we hand the sampler an unseen config
VERSION = __version__


class Search:
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
        # A time limit ends a search only once it has a config to answer with (measured now or stored before).
        timed_out = self.options.timeout_s is not None and clock() - start >= self.options.timeout_s
        if timed_out and (self.report.benchmarked > 0 or self.seen.ok()):
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
                    checkpoint(tuned_entry(self.key, ok[0], self.device, self.options, bench.label, self.seen))
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


def tuned_entry(
    key: CacheKey,
    best: TrialRecord,
    device: DeviceFingerprint,
    options: TuneOptions,
    timer_label: str,
    seen: Candidates,
    torch_ms: float | None = None,
) -> Entry:
    """The entry a search gives: `best` as the config and time, the run's provenance and every trial measured."""
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
