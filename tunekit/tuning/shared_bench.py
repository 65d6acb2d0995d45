"""One bench for a series of problems: a single isolation worker process (on a GPU) switched from problem to problem,
shared by fleet workers and the one-process `tune --plan`, so both pay the worker's start-up once."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec
from tunekit.tuning.phases import PhaseTimes

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint
    from tunekit.store.entry import Entry, TrialRecord
    from tunekit.store.store import Store
    from tunekit.tuning.bench import Timer
    from tunekit.tuning.isolation import IsolatedBench
    from tunekit.tuning.isolation_process import WorkerProcess
    from tunekit.tuning.tune_types import Bench, TuneOptions, TuneReport


class SharedBench:
    """Where a series of problems is measured: a fleet worker's jobs, or `tunekit tune` over a plan in one process.

    Isolated (on a GPU, as tune() decides, or forced with `isolate=True`): one isolation worker process serves every
    problem, switched to each one, so torch, Triton, the CUDA context and Triton's compiled kernels cost once per
    series rather than once per problem (tune() without a bench starts a worker per problem). Otherwise candidates
    run in this process, as tune() would run them.
    """

    def __init__(
        self, timer: Timer | None = None, isolate: bool | None = None, candidate_timeout_s: float | None = None
    ) -> None:
        from tunekit.tuning.bench import default_timer
        from tunekit.tuning.tune_types import TuneOptions
        from tunekit.tuning.tuner import isolated_timer

        self.timer = timer or default_timer()
        options = TuneOptions(isolate=isolate)
        self.candidate_timeout_s = candidate_timeout_s or options.candidate_timeout_s
        self._described = isolated_timer(options, self.timer)  # the timer as the worker rebuilds it; None: in-process
        self.isolated: IsolatedBench | None = None
        self._spawned: WorkerProcess | None = None
        if self._described is not None:
            from tunekit.tuning.isolation_process import prespawn

            # Started now, the isolation worker's interpreter, imports and CUDA context (seconds) overlap the
            # queue, the cache and the first claim instead of following them.
            self._spawned = prespawn()

    def open(self, spec: KernelSpec, problem: Problem, seed: int) -> Bench:
        """The bench for one problem, ready to measure (a load failure raises TunekitError: the problem's failure)."""
        from tunekit.tuning.verify import InProcessBench

        if self._described is None:
            return InProcessBench(spec, problem, seed, self.timer)
        if self.isolated is None:
            from tunekit.tuning.isolation import IsolatedBench

            self.isolated = IsolatedBench(
                spec,
                problem,
                seed,
                self._described,
                self.candidate_timeout_s,
                label=self.timer.label,
                spawned=self._spawned,
            )
            self._spawned = None
        else:
            self.isolated.retarget(spec, problem, seed, timer=self._described, label=self.timer.label)
        self.isolated.start()
        return self.isolated

    @property
    def started(self) -> int:
        return self.isolated.started if self.isolated is not None else int(self._spawned is not None)

    @property
    def restarts(self) -> int:
        return self.isolated.restarts if self.isolated is not None else 0

    def close(self) -> None:
        if self._spawned is not None:  # no job came
            self._spawned.close()
            self._spawned = None
        if self.isolated is not None:
            self.isolated.close()

    def on_first_use(self, spec: KernelSpec, problem: Problem, seed: int, phases: PhaseTimes | None = None) -> Bench:
        """The bench for one problem, opened when the tuner first uses it (a problem already tuned starts
        nothing), timing torch's op as tune() does without a bench (tunekit.tuning.torch_candidate), and adding its
        seconds to `phases` (startup, compile, verify, bench, torch)."""
        phases = phases if phases is not None else PhaseTimes()
        opener = functools.partial(self.open, spec, problem, seed)
        return cast("Bench", _ProblemBench(opener, spec, problem, seed, self.timer, phases))

    def tune(
        self,
        spec: KernelSpec,
        problem: Problem,
        device: DeviceFingerprint,
        options: TuneOptions,
        store: Store | None,
        *,
        on_trial: Callable[[TrialRecord, int], bool | None] | None = None,
        phases: PhaseTimes | None = None,
    ) -> tuple[Entry, TuneReport]:
        """Tune one problem on this bench and put the result in `store` (when given): the one per-problem path of
        `tune --plan` in one process, tune_plan and fleet workers. `phases` (also the report's) receives where its
        seconds went, even when it fails."""
        from tunekit.tuning.orchestrate import tune_and_store

        phases = phases if phases is not None else PhaseTimes()
        started = time.perf_counter()

        def timed_put(entry: Entry) -> Entry:
            assert store is not None
            with phases.timing("store"):
                return store.put(entry)

        bench = self.on_first_use(spec, problem, options.seed, phases)
        try:
            entry, report = tune_and_store(
                spec, problem, device, options, store, put=timed_put if store is not None else None, timer=self.timer,
                bench=bench, on_trial=on_trial,
            )  # fmt: skip
        finally:
            phases.close(time.perf_counter() - started)
        report.phases = phases.to_json()
        return entry, report


class _ProblemBench:
    """A problem's bench, opened on first use; `time_torch` times torch's op in this process, as tune() does.
    Every call's seconds go to `phases`: opening to startup, a measurement to the phases the bench reports
    (`last_phases`: compile, verify, bench), the rest of its wall time to other."""

    def __init__(
        self,
        open_bench: Callable[[], Bench],
        spec: KernelSpec,
        problem: Problem,
        seed: int,
        timer: Timer,
        phases: PhaseTimes,
    ) -> None:
        self._open = open_bench
        self._bench: Bench | None = None
        self._torch = (spec, problem, seed, timer)
        self.phases = phases
        self.label = timer.label

    def _opened(self) -> Bench:
        if self._bench is None:
            with self.phases.timing("startup"):
                self._bench = self._open()
        return self._bench

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._opened(), name)

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        return self._timed(lambda bench: bench.measure(config, verify_seed))

    def retime(self, config: Config) -> TrialRecord:
        return self._timed(lambda bench: bench.retime(config))

    def _timed(self, call: Callable[[Bench], TrialRecord]) -> TrialRecord:
        bench = self._opened()
        started = time.perf_counter()
        try:
            return call(bench)
        finally:
            wall = time.perf_counter() - started
            split: dict[str, float] = dict(getattr(bench, "last_phases", {}) or {"bench": wall})
            self.phases.merge(split)
            self.phases.add("other", wall - sum(split.values()))

    def precompile(self, configs: list[Config], threads: int) -> None:
        """Compile the search's first configs ahead (tunekit.tuning.precompile), as the bench can."""
        ahead = getattr(self._opened(), "precompile", None)
        if ahead is not None:
            with self.phases.timing("compile"):
                ahead(configs, threads)

    def time_torch(self) -> float | None:
        from tunekit.tuning.torch_candidate import time_torch

        with self.phases.timing("torch"):
            return time_torch(*self._torch)
