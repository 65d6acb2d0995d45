"""Where a problem's tuning seconds go (tunekit.tuning.phases), the same in `tune --plan` in one process and in a
fleet worker: both tune a problem through SharedBench.tune, torch's candidate included."""

from __future__ import annotations

import pytest
from toy_kernel import PlantedTimer

from tunekit.core.device import fingerprint
from tunekit.fleet.jobs import Job
from tunekit.fleet.workers import JobTimes, run_job
from tunekit.store.store import Store
from tunekit.tuning import torch_candidate
from tunekit.tuning.phases import PHASES, PhaseTimes, Stopwatch
from tunekit.tuning.shared_bench import SharedBench
from tunekit.tuning.tune_types import TuneOptions

PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


def test_phase_times_add_up_and_the_rest_is_other() -> None:
    phases = PhaseTimes()
    phases.add("compile", 1.5)
    phases.merge({"bench": 2.0, "verify": 0.5})
    phases.close(5.0)
    assert phases.seconds["other"] == pytest.approx(1.0) and phases.total == pytest.approx(5.0)
    assert list(phases.to_json()) == list(PHASES)
    with pytest.raises(ValueError, match="unknown phase"):
        phases.add("lunch", 1.0)
    laps: dict[str, float] = {}
    watch = Stopwatch(laps)
    watch.lap("compile")
    watch.lap("compile")
    assert set(laps) == {"compile"}


def test_one_process_splits_each_problem_into_phases(toy, tmp_path) -> None:
    """Every measured candidate's first launch is compile, the reference check verify, the timed runs bench; a
    checkpoint after every measurement is a store write; a tuned problem costs nothing but reads."""
    benches = SharedBench(PlantedTimer(), isolate=False)
    with Store(tmp_path) as store:
        first = benches.tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=3, sampler="random"), store)[1]
        again = benches.tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=3, sampler="random"), store)[1]
    benches.close()
    assert first.benchmarked == 3 and again.skipped
    got = first.phases
    assert all(got[p] > 0 for p in ("startup", "compile", "verify", "bench", "store"))
    assert got["torch"] >= 0 and got["other"] >= 0
    assert again.phases["compile"] == again.phases["bench"] == again.phases["startup"] == 0.0


def test_fleet_jobs_carry_torchs_time_as_one_process_does(toy, tmp_path, monkeypatch) -> None:
    """Fleet workers' benches time torch too (without time_torch, their entries lacked torch's time)."""
    monkeypatch.setattr(torch_candidate, "time_torch", lambda *args: 0.125)
    job = Job("toy", PROBLEM, trials=2, sampler="random")
    benches = SharedBench(PlantedTimer(), isolate=False)
    times = JobTimes()
    with Store(tmp_path / "fleet") as store:
        fleet_entry, _ = run_job(job, store, None, benches, times)
    with Store(tmp_path / "here") as store:
        options = TuneOptions(trials=2, sampler="random", seed=job.seed)
        here_entry, _ = benches.tune(toy, PROBLEM, fingerprint(), options, store)
    benches.close()
    assert fleet_entry.provenance["torch_ms"] == here_entry.provenance["torch_ms"] == 0.125
    assert [t.to_json() for t in fleet_entry.trials] == [t.to_json() for t in here_entry.trials]
    assert times.problem.seconds["bench"] > 0 and times.seconds("claim") == 0.0
