"""Tuning without a GPU: the real tuner run against a device that answers from a recorded timing table.

A `SimulatedDevice` is a `tunekit.tuning.tune_types.Bench` whose measurements are the rows of a `TimingTable` (an
exhaustive sweep recorded on real hardware), and whose cost is charged to a `SimulatedClock`: a candidate costs its
recorded compile time plus what the real tuner spends verifying and timing it. Search strategies can then be compared
on a CPU machine, deterministically, in trials and in the device seconds they would have taken.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunekit.core.registry import get_spec
from tunekit.core.space import Config, config_id
from tunekit.evaluation.timing_table import TimingTable
from tunekit.store.entry import TrialRecord
from tunekit.tuning.bench import CudaEventTimer
from tunekit.tuning.ranker import Ranker
from tunekit.tuning.tune_types import TuneOptions, TuneReport
from tunekit.tuning.tuner import tune

__all__ = ["CandidateCost", "SimulatedClock", "SimulatedDevice", "Simulation", "check_table", "simulate_tune"]

NOT_RECORDED = "not in the recorded table"
_REAL_TIMER = CudaEventTimer()  # the timer the real tuner uses on a GPU: its warm-up and repetition budgets
# triton.testing.do_bench launches once, then 5 times to estimate the kernel's time, before warming up.
_DO_BENCH_FIXED_LAUNCHES = 1 + 5


class SimulatedClock:
    """Seconds of simulated device time; only `advance` moves it. Call it to read it (the tuner's `clock`)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back, but got {seconds} s")
        self.now_s += seconds

    def __call__(self) -> float:
        return self.now_s


@dataclass(frozen=True)
class CandidateCost:
    """Device seconds the real tuner spends on one candidate besides compiling it (compile time is recorded).

    `verify_s` is an estimate for the recorded problem sizes: fresh random inputs, one launch, the torch reference
    and the comparison (done on the host, in float64). The timing cost follows do_bench: a few fixed launches,
    then warm-up and repetitions sized to fill `warmup_ms` and `rep_ms` (at least one launch each).
    """

    verify_s: float = 0.1
    warmup_ms: float = _REAL_TIMER.warmup_ms
    rep_ms: float = _REAL_TIMER.rep_ms

    def bench_s(self, time_ms: float) -> float:
        launches_ms = _DO_BENCH_FIXED_LAUNCHES * time_ms + max(self.warmup_ms, time_ms) + max(self.rep_ms, time_ms)
        return launches_ms / 1e3


class SimulatedDevice:
    """The tuner's Bench protocol answered from a timing table; every call charges the clock.

    `measure` answers the recorded outcome (ok with its time, wrong, failed) and costs the recorded compile time,
    plus verification for a config that ran and timing for a correct one. A config the table lacks is `failed`
    and costs nothing (nothing is known about it). `retime` costs the timing only; `retime_noise` (a relative
    standard deviation, off by default) perturbs its answer, deterministically for a given `noise_seed`.
    """

    def __init__(
        self,
        table: TimingTable,
        clock: SimulatedClock,
        cost: CandidateCost | None = None,
        *,
        retime_noise: float = 0.0,
        noise_seed: int = 0,
    ) -> None:
        if retime_noise < 0:
            raise ValueError(f"retime noise must be >= 0, but got {retime_noise}")
        self.table = table
        self.clock = clock
        self.cost = cost or CandidateCost()
        self.retime_noise = retime_noise
        self.noise_seed = noise_seed
        self.label = f"simulated:{table.timer}"
        self.measured: Counter[Any] = Counter()  # config id -> measure calls
        self.retimed: Counter[Any] = Counter()  # config id -> retime calls

    @property
    def measure_calls(self) -> int:
        return sum(self.measured.values())

    @property
    def retime_calls(self) -> int:
        return sum(self.retimed.values())

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        self.measured[config_id(config)] += 1
        row = self.table.row(config)
        if row is None:
            return TrialRecord(dict(config), "failed", error=NOT_RECORDED)
        seconds = row.compile_s or 0.0
        if row.status != "failed":
            seconds += self.cost.verify_s
        if row.status == "ok" and row.time_ms is not None:
            seconds += self.cost.bench_s(row.time_ms)
        self.clock.advance(seconds)
        return row.record()

    def retime(self, config: Config) -> TrialRecord:
        key = config_id(config)
        self.retimed[key] += 1
        row = self.table.row(config)
        if row is None:
            return TrialRecord(dict(config), "failed", error=NOT_RECORDED)
        if row.status != "ok" or row.time_ms is None:
            return row.record()
        self.clock.advance(self.cost.bench_s(row.time_ms))
        time_ms = row.time_ms
        if self.retime_noise:
            # Seeded by config and call count: the same run always sees the same noise, whatever the call order.
            rng = random.Random(f"{self.noise_seed}:{key}:{self.retimed[key]}")
            time_ms *= max(0.0, 1.0 + rng.gauss(0.0, self.retime_noise))
        return TrialRecord(dict(config), "ok", time_ms=time_ms)


@dataclass
class Simulation:
    """One simulated tuning run: the real tuner's report and the device it measured on (with its clock)."""

    report: TuneReport
    device: SimulatedDevice

    @property
    def elapsed_s(self) -> float:
        """Simulated device seconds the whole run took, the final re-timing of the top configs included."""
        return self.device.clock()


def simulate_tune(
    table: TimingTable,
    strategy: str,
    seed: int,
    *,
    max_trials: int,
    on_trial: Callable[[TrialRecord, int], bool | None] | None = None,
    timeout_s: float | None = None,
    cost: CandidateCost | None = None,
    clock: SimulatedClock | None = None,
    ranker: Ranker | None = None,
) -> Simulation:
    """Run the real `tunekit.tuning.tuner.tune`, unchanged, on the device `table` was recorded on.

    `timeout_s` is a budget of simulated seconds; pass `clock` to read it while the search runs (in `on_trial`).
    `ranker` is the model strategy's ranking correction (None: the shipped one; the efficiency benchmark passes
    one fitted without `table`).
    """
    clock = SimulatedClock() if clock is None else clock
    device = SimulatedDevice(table, clock, cost)
    options = TuneOptions(
        trials=max_trials,
        timeout_s=timeout_s,
        sampler=strategy,
        seed=seed,
        isolate=False,
        remeasure_top=3,
        ranker=ranker,
    )
    report = tune(
        get_spec(table.kernel),
        table.problem,
        table.fingerprint,
        options,
        on_trial=on_trial,
        bench=device,
        clock=clock,
        limits=table.device_limits,  # the model reads the recorded device's limits, not this machine's
    )
    return Simulation(report, device)


def table_name(table: TimingTable) -> str:
    """Kernel, problem and device: the same problem is recorded on several devices."""
    problem = ",".join(f"{k}={v}" for k, v in table.problem.items())
    return f"{table.kernel}[{problem}]@{table.fingerprint.label}"


def heuristic_ms(table: TimingTable) -> float | None:
    """The recorded time of the kernel's heuristic default for the table's problem; None if it did not run."""
    try:
        heuristic = get_spec(table.kernel).heuristic(table.problem, table.fingerprint)
    except Exception:  # check_table reports a kernel that cannot be loaded
        return None
    row = table.row(heuristic)
    return row.time_ms if row is not None and row.status == "ok" else None


def check_table(table: TimingTable) -> list[str]:
    """Why simulating on `table` could mislead: 'error: ...' (do not use it) or 'warning: ...' lines.

    The simulation is only meaningful when the table holds exactly the configs the current space finds valid
    for its problem on its device: a config the tuner may propose but the table lacks would read as failed.
    """
    try:
        spec = get_spec(table.kernel)
    except Exception as exc:  # an unknown kernel, or one that no longer imports
        return [f"error: kernel {table.kernel!r} cannot be loaded: {exc}"]
    problems: list[str] = []
    if table.source_hash != spec.source_hash:
        problems.append(
            f"warning: recorded for source {table.source_hash}, the kernel is now {spec.source_hash} "
            "(timings may have moved)"
        )
    recorded = Counter(config_id(r.config) for r in table.rows)
    duplicated = sum(1 for n in recorded.values() if n > 1)
    if duplicated:
        problems.append(f"error: {duplicated} configs are recorded more than once")
    valid = {config_id(c) for c in spec.space.valid_configs(table.problem, table.fingerprint)}
    missing, extra = len(valid - recorded.keys()), len(recorded.keys() - valid)
    if missing or extra:
        problems.append(
            f"error: the space has {len(valid)} valid configs, the table {len(recorded)}: "
            f"{missing} valid ones not recorded, {extra} recorded ones no longer valid"
        )
    if not table.ok_rows():
        problems.append("error: no recorded config is correct")
    return problems
