"""One bench for a series of problems: a single isolation worker process (on a GPU) switched from problem to problem,
shared by fleet workers and the one-process `tune --plan`, so both pay the worker's start-up once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec

if TYPE_CHECKING:
    from tunekit.tuning.bench import Timer
    from tunekit.tuning.isolation import IsolatedBench, Spawned
    from tunekit.tuning.tuner import Bench


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
        from tunekit.tuning.tuner import TuneOptions, _isolation

        self.timer = timer or default_timer()
        options = TuneOptions(isolate=isolate)
        self.candidate_timeout_s = candidate_timeout_s or options.candidate_timeout_s
        self._described = _isolation(options, self.timer)  # the timer as the worker rebuilds it; None: in-process
        self.isolated: IsolatedBench | None = None
        self._spawned: Spawned | None = None
        if self._described is not None:
            from tunekit.tuning.isolation import prespawn

            # Started now, the isolation worker's interpreter, imports and CUDA context (seconds) overlap the
            # queue, the cache and the first claim instead of following them.
            self._spawned = prespawn()

    def open(self, spec: KernelSpec, problem: Problem, seed: int) -> Bench:
        """The bench for one problem, ready to measure (a load failure raises TunekitError: the problem's failure)."""
        from tunekit.tuning.tuner import InProcessBench

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

    def on_first_use(self, spec: KernelSpec, problem: Problem, seed: int) -> Bench:
        """The bench for one problem, opened when the tuner first uses it (a problem already tuned starts
        nothing), and timing torch's op as tune() does without a bench (tunekit.tuning.torch_candidate)."""
        return cast("Bench", _ProblemBench(lambda: self.open(spec, problem, seed), spec, problem, seed, self.timer))


class _ProblemBench:
    """A problem's bench, opened on first use; `time_torch` times torch's op in this process, as tune() does."""

    def __init__(
        self, open_bench: Callable[[], Bench], spec: KernelSpec, problem: Problem, seed: int, timer: Timer
    ) -> None:
        self._open = open_bench
        self._bench: Bench | None = None
        self._torch = (spec, problem, seed, timer)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._bench is None:
            self._bench = self._open()
        return getattr(self._bench, name)

    def time_torch(self) -> float | None:
        from tunekit.tuning.torch_candidate import time_torch

        return time_torch(*self._torch)
