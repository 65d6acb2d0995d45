"""What a tuning run is given and what it answers: its options (`TuneOptions`), where it measures candidates (a
`Bench`) and its report (`TuneReport`). Apart from the tuner (tunekit.tuning.tuner) so the search loop
(tunekit.tuning.search) and callers that only build options or read reports need not import the tuner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tunekit.core.errors import TunekitError
from tunekit.core.space import Config
from tunekit.store.entry import Entry, TrialRecord
from tunekit.tuning.ranker import Ranker
from tunekit.tuning.samplers import DEFAULT_SAMPLER

ALREADY_TUNED = "already tuned"  # the stop reason of a problem whose stored trials already reach the budget


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
