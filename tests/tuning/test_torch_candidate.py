"""torch as a tuning candidate: the tuner times it after the search and keeps its time with the entry; dispatch then
serves torch's op for a tuned problem whose best Triton config is not faster (on a GPU only)."""

from __future__ import annotations

import dataclasses

import pytest
from fingerprints import H200, H200_LIMITS, INTERPRETER
from test_tuner_perf_model import RAW, SPEC, PlantedBench

from tunekit.core.space import config_id
from tunekit.kernels.gemm.problem import make_problem
from tunekit.runtime import dispatch
from tunekit.store.entry import GPU_TIMER, SUPERSEDED_TIMERS, torch_time
from tunekit.store.store import Store
from tunekit.tuning import torch_candidate
from tunekit.tuning.bench import WallClockTimer
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune

PROBLEM = make_problem(1000, 3000, 2000, "bfloat16", has_bias=True)


class TimesTorch(PlantedBench):
    """A planted bench that can also time torch (as a simulated device with a torch column would)."""

    def __init__(self, times: dict, torch_ms: float) -> None:
        super().__init__(times)
        self.torch_ms = torch_ms

    def time_torch(self) -> float:
        return self.torch_ms


def tuned_entry(bench: PlantedBench):
    options = TuneOptions(trials=3, ranker=RAW)
    return tune(SPEC, PROBLEM, H200, options, bench=bench, limits=H200_LIMITS).entry


def test_the_tuner_keeps_torchs_time_with_the_entry() -> None:
    entry = tuned_entry(TimesTorch({}, torch_ms=0.75))
    assert entry.provenance["torch_ms"] == 0.75 and entry.time_ms == 1.0
    assert torch_time(entry.provenance) == 0.75
    # a supplied bench that cannot time torch (a simulated device): nothing recorded
    assert "torch_ms" not in tuned_entry(PlantedBench()).provenance


def test_torch_is_not_timed_in_the_interpreter() -> None:
    assert torch_candidate.time_torch(SPEC, PROBLEM, 0, WallClockTimer()) is None


@pytest.mark.parametrize("value", [None, "0.5", True, -1.0, 0])
def test_a_malformed_torch_time_is_ignored(value) -> None:
    assert torch_time({} if value is None else {"torch_ms": value}) is None


def _resolved_with(entry, device) -> dispatch.Resolution:
    """How dispatch resolves PROBLEM on `device` with `entry` in the user's cache."""
    store = Store()
    try:
        store.put(entry)
        return dispatch.resolve(SPEC, PROBLEM, device, store)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("torch_ms", "device", "served"),
    [
        (0.75, H200, "torch-measured"),  # torch measured faster: its op runs
        (1.0, H200, "torch-measured"),  # a tie: torch (nothing says the kernel is faster)
        (1.25, H200, "cache"),  # the tuned config is faster
        (0.75, INTERPRETER, "cache"),  # the interpreter runs the kernels it tests
    ],
)
def test_dispatch_serves_torch_where_the_tuner_measured_it_at_least_as_fast(
    isolated_cache, monkeypatch, torch_ms, device, served
) -> None:
    entry = tuned_entry(TimesTorch({}, torch_ms=torch_ms))
    entry = dataclasses.replace(entry, key=dataclasses.replace(entry.key, device_key=device.key))
    resolution = _resolved_with(entry, device)
    assert resolution.layer == served and resolution.entry is not None
    if served == "torch-measured":
        assert resolution.config is dispatch.TORCH
    else:
        assert config_id(resolution.config) == config_id(entry.config)


def test_storing_keeps_torchs_time_when_a_checkpoint_already_holds_the_best(isolated_cache) -> None:
    """tune_and_store checkpoints the entry during the search (no torch time yet) and stores the final entry
    after: the merge must keep the final entry's torch time even where the checkpoint's best wins the merge."""
    final = tuned_entry(TimesTorch({}, torch_ms=0.75))
    checkpoint = dataclasses.replace(final, provenance={k: v for k, v in final.provenance.items() if k != "torch_ms"})
    store = Store()
    try:
        store.put(checkpoint)
        stored = store.put(dataclasses.replace(final, time_ms=final.time_ms * 1.01))  # retimed a little slower
    finally:
        store.close()
    assert stored.time_ms == checkpoint.time_ms and stored.provenance["torch_ms"] == 0.75


def test_tune_prints_torchs_time_and_who_serves() -> None:
    from tunekit.cli.views import TuneResult

    bench = TimesTorch({}, torch_ms=0.75)
    report = tune(SPEC, PROBLEM, H200, TuneOptions(trials=3, ranker=RAW), bench=bench, limits=H200_LIMITS)
    result = TuneResult(SPEC, PROBLEM, report, report.entry, heuristic_ms=1.0, interpreter=False)
    assert result.timing() == "1.0000 ms, heuristic 1.0000 ms (1.00x), torch 0.7500 ms (0.75x), torch serves it"
    assert result.to_json()["torch_ms"] == 0.75
    slower = dataclasses.replace(report.entry, provenance={**report.entry.provenance, "torch_ms": 2.0})
    assert dataclasses.replace(result, entry=slower).timing().endswith("torch 2.0000 ms (2.00x)")


@pytest.mark.parametrize(
    ("time_ms", "torch_ms", "served"),
    [
        (0.02, None, "torch-launch-bound"),
        (0.05, None, "cache"),  # launch-bound, no torch time: nothing says the kernel wins in use
        (0.02, 0.05, "cache"),  # launch-bound, but the tuner timed torch slower (host cost counted)
        (0.02, 0.021, "torch-measured"),  # host floors within HOST_FLOOR_MARGIN: noise may order them either way
        (0.5, None, "cache"),  # GPU-bound: the GPU time decides
        (0.5, 0.51, "cache"),  # ...and the GPU time is not a host floor: no margin
    ],
)
def test_a_launch_bound_entry_needs_torchs_time_to_serve_triton(
    isolated_cache, monkeypatch, time_ms, torch_ms, served
) -> None:
    entry = tuned_entry(TimesTorch({}, torch_ms=torch_ms) if torch_ms else PlantedBench())
    provenance = {k: v for k, v in entry.provenance.items() if torch_ms or k != "torch_ms"}
    entry = dataclasses.replace(
        entry, time_ms=time_ms, provenance=provenance, key=dataclasses.replace(entry.key, device_key=H200.key)
    )
    resolution = _resolved_with(entry, H200)
    assert resolution.layer == served
    assert (resolution.config is dispatch.TORCH) == (served != "cache")


@pytest.mark.parametrize(("time_ms", "served"), [(0.02, "torch-launch-bound"), (0.5, "cache")])
@pytest.mark.parametrize("timer", sorted(SUPERSEDED_TIMERS))
def test_an_entry_an_earlier_timer_measured_launch_bound_serves_torch(
    isolated_cache, monkeypatch, timer, time_ms, served
) -> None:
    """An earlier method timed a launch-bound candidate by its bare launch (not tunekit's per-call path) and torch
    with work its commonest call does not do: under the host floor its verdict does not hold in use."""
    entry = tuned_entry(TimesTorch({}, torch_ms=time_ms * 2.5))
    provenance = {**entry.provenance, "timer": timer}
    entry = dataclasses.replace(
        entry, time_ms=time_ms, provenance=provenance, key=dataclasses.replace(entry.key, device_key=H200.key)
    )
    assert _resolved_with(entry, H200).layer == served
    current = dataclasses.replace(entry, provenance={**provenance, "timer": GPU_TIMER})
    assert dispatch.serves_kernel(SPEC, current, H200)  # timed by the current method: its times decide
