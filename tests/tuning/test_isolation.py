"""Isolated benchmarking (tuning.isolation): candidates that hang, crash or poison their process are failed records.

The toy kernel commits the faults named in TOY_FAULTS (see tests/toy_kernel.py); the worker inherits the variable.
On the H200 the same machinery meets real faults: .device/issue7.py (compile error, shared memory, an infinite
loop, an illegal memory access).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import toy_kernel
from helpers import TESTS
from toy_kernel import PlantedTimer
from triton.runtime.errors import OutOfResources

from tunekit.core import backend, registry
from tunekit.core.device import fingerprint
from tunekit.core.errors import TunekitError
from tunekit.store.entry import Entry
from tunekit.store.key import CacheKey
from tunekit.tuning.bench import CudaEventTimer, WallClockTimer, timer_to_json
from tunekit.tuning.isolation import IsolatedBench
from tunekit.tuning.isolation_process import prespawn
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import isolated_timer, tune
from tunekit.tuning.verify import InProcessBench

PROBLEM = {"rows": 8, "cols": 64, "dtype": "float32"}
FAULTS = {"2/a/1": "hang", "4/a/2": "exit", "8/a/1": "segfault", "2/b/2": "poison"}
# A second kernel for one worker to switch to: the toy judged by another reference, so only variant "wrong"
# (2x + 1) is right. The worker imports it from this module (registered per test as "toy_plus_one").
PLUS_ONE = dataclasses.replace(toy_kernel.SPEC, name="toy_plus_one", reference=lambda inputs: (inputs[0] * 2 + 1,))
SECOND = {"rows": 4, "cols": 32, "dtype": "float16"}


def _cfg(text: str) -> dict:
    block, variant, warps = text.split("/")
    return {"BLOCK": int(block), "variant": variant, "num_warps": int(warps)}


def _by_config(records) -> dict:
    return {tuple(sorted(r.config.items())): r for r in records}


def test_hang_crash_and_poisoned_context_are_failed_and_the_run_finishes(toy, monkeypatch):
    """Every fault is one failed record, the worker is replaced each time, every other config gets the same
    verdict as in-process, and the run ends with the planted best."""
    exhaustive = TuneOptions(trials=1000, sampler="exhaustive")
    baseline = tune(toy, PROBLEM, fingerprint(), exhaustive, timer=PlantedTimer())  # in-process, no faults
    monkeypatch.setenv("TOY_FAULTS", json.dumps(FAULTS))
    options = dataclasses.replace(exhaustive, isolate=True, candidate_timeout_s=3.0)
    start = time.monotonic()
    report = tune(toy, PROBLEM, fingerprint(), options, timer=PlantedTimer())
    elapsed = time.monotonic() - start

    assert report.isolated and report.stop_reason == "space exhausted"
    assert report.entry.config == PlantedTimer().best
    assert report.restarts == len(FAULTS)  # hang (killed), exit, segfault, poisoned context
    got, want = _by_config(report.entry.trials), _by_config(baseline.entry.trials)
    assert got.keys() == want.keys()
    faulty = {tuple(sorted(_cfg(k).items())): fault for k, fault in FAULTS.items()}
    for cid, record in got.items():
        if cid in faulty:
            assert record.status == "failed", (cid, record)
        else:  # nothing after a fault is blamed for it: a fresh worker measures the next config
            assert record.status == want[cid].status, (cid, record, want[cid])
            assert record.time_ms == want[cid].time_ms  # the planted timer ran in the worker
    errors = {fault: got[cid].error for cid, fault in faulty.items()}
    assert errors["hang"].startswith("timeout: no result within 3 s")
    assert errors["exit"] == "worker died: exit status 3"
    assert errors["segfault"].startswith("worker died: killed by signal SIGSEGV")
    assert "illegal memory access" in errors["poison"]
    assert elapsed < 60


def test_isolated_and_in_process_runs_agree(toy):
    options = TuneOptions(trials=8, sampler="random", seed=5)
    here = tune(toy, PROBLEM, fingerprint(), options, timer=PlantedTimer())
    there = tune(toy, PROBLEM, fingerprint(), dataclasses.replace(options, isolate=True), timer=PlantedTimer())
    assert there.isolated and not here.isolated and there.restarts == 0
    assert [r.to_json() for r in there.records] == [r.to_json() for r in here.records]
    assert there.entry.config == here.entry.config and there.entry.time_ms == here.entry.time_ms


def test_a_bug_in_the_worker_is_raised_not_recorded(toy, monkeypatch):
    monkeypatch.setenv("TOY_FAULTS", json.dumps({"1/a/1": "bug"}))  # the heuristic, measured first
    with pytest.raises(TunekitError, match=r"raised ValueError: planted bug in the worker \(not a known kernel"):
        tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=3, isolate=True), timer=PlantedTimer())


def test_isolation_is_on_for_gpus_off_in_the_interpreter_and_forced_by_the_option(monkeypatch):
    assert isolated_timer(TuneOptions(), WallClockTimer()) is None  # the interpreter: spawning costs seconds
    assert isolated_timer(TuneOptions(isolate=True), WallClockTimer()) == {
        "class": "tunekit.tuning.bench:WallClockTimer",
        "state": {"repeats": 3},
    }
    monkeypatch.setattr(backend, "INTERPRETED", False)
    assert isolated_timer(TuneOptions(), CudaEventTimer())["class"] == "tunekit.tuning.bench:CudaEventTimer"
    assert isolated_timer(TuneOptions(), PlantedTimer()) is None  # custom timers stay in-process unless forced
    assert isolated_timer(TuneOptions(isolate=False), CudaEventTimer()) is None

    class LocalTimer:
        label = "local"

        def __call__(self, fn, config):
            return 1.0

    with pytest.raises(TunekitError, match="isolate=True needs a timer the worker process can rebuild"):
        isolated_timer(TuneOptions(isolate=True), LocalTimer())
    with pytest.raises(TunekitError, match="candidate timeout must be > 0"):
        TuneOptions(candidate_timeout_s=0)


def test_a_worker_that_cannot_load_the_kernel_is_a_clear_error(toy, monkeypatch):
    from tunekit.core import registry

    edited = dataclasses.replace(toy, version=toy.version + 1)  # the tuner's spec is not the module's
    monkeypatch.setitem(registry._loaded, "toy", edited)
    with pytest.raises(TunekitError, match=rf"source hash \S+, but the tuner has {re.escape(edited.source_hash)}"):
        tune(edited, PROBLEM, fingerprint(), TuneOptions(trials=2, isolate=True), timer=PlantedTimer())
    ghost = dataclasses.replace(toy, name="ghost")
    with pytest.raises(TunekitError, match="defines no KernelSpec named 'ghost'"):
        tune(ghost, PROBLEM, fingerprint(), TuneOptions(trials=2, isolate=True), timer=PlantedTimer())


def test_a_winner_that_fails_when_measured_again_is_replaced(toy):
    class FlakyTimer(PlantedTimer):
        def __call__(self, fn, config):
            if config == self.best and self.calls.get(tuple(sorted(config.items()))):
                raise OutOfResources(1, 0, "shared memory")  # the second timing of the planted best fails
            return super().__call__(fn, config)

    report = tune(toy, PROBLEM, fingerprint(), TuneOptions(trials=1000, sampler="exhaustive"), timer=FlakyTimer())
    assert report.entry.config != PlantedTimer().best
    flaky = _by_config(report.entry.trials)[tuple(sorted(PlantedTimer().best.items()))]
    assert flaky.status == "failed" and flaky.error.startswith("failed when measured again: OutOfResources")


def test_warm_start_measures_related_bests_first(toy):
    """Entries of another source or device are never served, but their configs are tried right after the
    heuristic; one that is no longer in the space is ignored."""
    device = fingerprint()
    planted = PlantedTimer().best
    stale_key = CacheKey.make("toy", "old-source", device.key, PROBLEM)
    stale = Entry(stale_key, planted, 1.0, device.to_json(), {})
    outside = Entry(stale_key, {"BLOCK": 3, "variant": "a", "num_warps": 1}, 0.5, device.to_json(), {})
    report = tune(
        toy, PROBLEM, device, TuneOptions(trials=2, sampler="random"), timer=PlantedTimer(), warm_start=[outside, stale]
    )
    assert report.warm_started == 1
    assert [r.config for r in report.records] == [toy.heuristic(PROBLEM, device), planted]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the worker")
def test_the_worker_dies_with_a_killed_tuner(tmp_path):
    """SIGKILL the tuner while its worker runs a hanging candidate: the worker must not outlive it."""
    script = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {str(TESTS)!r})
        os.environ["TOY_FAULTS"] = json.dumps({{"1/a/1": "hang"}})
        from tunekit.core import registry
        registry.KERNELS["toy"] = "toy_kernel"
        from toy_kernel import PlantedTimer
        from tunekit.core.device import fingerprint
        from tunekit.tuning.tune_types import TuneOptions
        from tunekit.tuning.tuner import tune
        tune(registry.get_spec("toy"), {PROBLEM!r}, fingerprint(), TuneOptions(isolate=True), timer=PlantedTimer())
        """
    )
    tuner = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    try:
        worker = None
        deadline = time.monotonic() + 60
        while worker is None and time.monotonic() < deadline:
            time.sleep(0.2)
            worker = next(iter(_children(tuner.pid)), None)
        assert worker is not None, "the tuner never started a worker"
        time.sleep(1.0)  # let it reach the hanging launch
    finally:
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- one worker, many targets (a fleet worker keeps one for its lifetime) -------------------------------------


@pytest.fixture
def plus_one(toy, monkeypatch):
    monkeypatch.setitem(registry.KERNELS, PLUS_ONE.name, "test_isolation")
    return PLUS_ONE


def test_a_retargeted_worker_measures_the_new_target_in_the_same_process(plus_one):
    """After retarget the same process measures another kernel and problem, exactly as in-process."""
    configs = [_cfg("1/a/1"), _cfg("4/wrong/2"), _cfg("64/b/1"), _cfg("16/b/4")]
    with IsolatedBench(toy_kernel.SPEC, PROBLEM, 0, timer_to_json(PlantedTimer()), 30.0, label="fake") as bench:
        assert [bench.measure(c, 7).status for c in configs] == ["ok", "wrong", "failed", "ok"]
        pid = bench.pid
        bench.retarget(plus_one, SECOND, 1, label="fake, again")
        got = [bench.measure(c, 7) for c in configs] + [bench.retime(configs[1])]
        assert (bench.pid, bench.started, bench.restarts, bench.label) == (pid, 1, 0, "fake, again")
        report = tune(plus_one, SECOND, fingerprint(), TuneOptions(trials=6, sampler="random"), bench=bench)
        assert bench.pid == pid and bench.started == 1
    here = InProcessBench(plus_one, SECOND, 1, PlantedTimer())
    want = [here.measure(c, 7) for c in configs] + [here.retime(configs[1])]
    assert [r.to_json() for r in got] == [r.to_json() for r in want]
    assert [r.status for r in got] == ["wrong", "ok", "failed", "wrong", "ok"]  # the new reference judged them
    assert report.entry.config["variant"] == "wrong" and report.entry.provenance["timer"] == "fake, again"


def test_a_crash_or_hang_after_retarget_restarts_the_worker_on_the_new_target(plus_one, monkeypatch):
    monkeypatch.setenv("TOY_FAULTS", json.dumps({"8/a/1": "segfault", "2/a/1": "hang"}))
    with IsolatedBench(toy_kernel.SPEC, PROBLEM, 0, timer_to_json(PlantedTimer()), 3.0) as bench:
        assert bench.measure(_cfg("1/a/1"), 7).status == "ok"
        first = bench.pid
        bench.retarget(plus_one, SECOND, 1)
        crashed = bench.measure(_cfg("8/a/1"), 7)
        assert crashed.status == "failed" and crashed.error.startswith("worker died: killed by signal SIGSEGV")
        assert bench.measure(_cfg("4/wrong/2"), 7).status == "ok"  # right under the new target's reference only
        assert bench.pid != first and (bench.started, bench.restarts) == (2, 1)
        hung = bench.measure(_cfg("2/a/1"), 7)
        assert hung.error.startswith("timeout: no result within 3 s") and bench.pid is None
        bench.retarget(toy_kernel.SPEC, PROBLEM, 0)
        assert bench.measure(_cfg("4/wrong/2"), 7).status == "wrong"  # the replacement started on the toy
        assert (bench.started, bench.restarts) == (3, 2)


def test_a_target_the_worker_cannot_switch_to_gets_a_fresh_worker_then_a_clear_error(toy):
    edited = dataclasses.replace(toy, version=toy.version + 1)  # the tuner's spec is not the module's
    with IsolatedBench(toy, PROBLEM, 0, timer_to_json(PlantedTimer()), 30.0) as bench:
        assert bench.measure(_cfg("1/a/1"), 7).status == "ok"
        bench.retarget(edited, SECOND, 1)
        with pytest.raises(TunekitError, match=rf"source hash \S+, but the tuner has {re.escape(edited.source_hash)}"):
            bench.measure(_cfg("1/a/1"), 7)
        assert (bench.started, bench.pid) == (2, None)  # the running one could not switch, nor could a fresh one
        bench.retarget(toy, SECOND, 1)
        assert bench.measure(_cfg("1/a/1"), 7).status == "ok" and bench.started == 3


def test_a_prespawned_worker_warms_up_then_serves_its_first_target(toy):
    """prespawn starts the process before a target is known (its warm-up has no reply); the bench that adopts it
    measures in that same process, exactly as in-process, and closing the bench ends it."""
    configs = [_cfg("1/a/1"), _cfg("4/wrong/2"), _cfg("64/b/1"), _cfg("16/b/4")]
    spawned = prespawn()
    pid = spawned.proc.pid
    timer = timer_to_json(PlantedTimer())
    with IsolatedBench(toy_kernel.SPEC, PROBLEM, 0, timer, 30.0, spawned=spawned) as bench:
        got = [bench.measure(c, 7) for c in configs]
        assert (bench.pid, bench.started, bench.restarts) == (pid, 1, 0)
    here = InProcessBench(toy_kernel.SPEC, PROBLEM, 0, PlantedTimer())
    assert [r.to_json() for r in got] == [here.measure(c, 7).to_json() for c in configs]
    assert [r.status for r in got] == ["ok", "wrong", "failed", "ok"]
    assert not _alive(pid)


def test_a_prespawned_worker_never_adopted_is_stopped_by_close():
    spawned = prespawn()
    pid = spawned.proc.pid
    assert _alive(pid)
    spawned.close()
    assert not _alive(pid) and spawned.proc.returncode is not None


def test_a_plan_in_one_process_shares_one_isolation_worker(toy):
    """`tune --plan` in one process measures every problem in one isolation worker, switched from problem to
    problem (as a fleet worker does), not one started per problem; a problem already tuned starts nothing."""
    from tunekit.store.store import Store
    from tunekit.tuning.orchestrate import tune_and_store
    from tunekit.tuning.shared_bench import SharedBench

    options = TuneOptions(trials=3, isolate=True)
    problems = [dict(PROBLEM, cols=c) for c in (64, 100, 64)]
    benches = SharedBench(PlantedTimer(), isolate=True)
    with Store() as store:
        reports = []
        for p in problems:
            bench = benches.on_first_use(toy, p, options.seed)
            reports.append(tune_and_store(toy, p, fingerprint(), options, store, timer=PlantedTimer(), bench=bench)[1])
    benches.close()
    assert [r.skipped for r in reports] == [False, False, True]
    assert all(len(r.entry.trials) == 3 for r in reports)
    assert benches.started == 1 and benches.restarts == 0
