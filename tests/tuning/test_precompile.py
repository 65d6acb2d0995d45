"""Compiling a problem's first candidates ahead, on a pool of threads (tunekit.tuning.precompile): the tuner hands
the bench its first configs before measuring any, and each is launched compile-only on a pool thread. Triton's own
compile is a GPU matter (tests/gpu/plan_tune_phases.py); here the launches are planted."""

from __future__ import annotations

import threading

from fingerprints import H200, H200_LIMITS

from tunekit.core.registry import get_spec
from tunekit.core.space import Config
from tunekit.store.entry import TrialRecord
from tunekit.tuning import precompile
from tunekit.tuning.ranker import Ranker
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune

SPEC = get_spec("gemm")
PROBLEM = SPEC.default_problems(H200)[0]


class AheadBench:
    label = "planted"

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def precompile(self, configs: list[Config], threads: int) -> None:
        self.events.append(("precompile", [dict(c) for c in configs]))

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        self.events.append(("measure", dict(config)))
        return TrialRecord(dict(config), "ok", time_ms=1.0 + len(self.events) * 0.01)

    def retime(self, config: Config) -> TrialRecord:
        return TrialRecord(dict(config), "ok", time_ms=1.0)


def test_the_first_configs_are_compiled_ahead_before_any_is_measured() -> None:
    bench = AheadBench()
    options = TuneOptions(trials=6, ranker=Ranker("gemm"), precompile_threads=4)
    tune(SPEC, PROBLEM, H200, options, bench=bench, limits=H200_LIMITS)
    kind, ahead = bench.events[0]
    assert kind == "precompile" and 1 < len(ahead) <= 6  # at most the trial budget
    assert [e for e in bench.events if e[0] == "precompile"] == [bench.events[0]]  # once
    measured = [c for kind, c in bench.events if kind == "measure"]
    assert measured[: len(ahead)] == ahead  # compiled in the order they are then measured
    plain = AheadBench()
    tune(SPEC, PROBLEM, H200, TuneOptions(trials=6, ranker=Ranker("gemm")), bench=plain, limits=H200_LIMITS)
    assert all(kind == "measure" for kind, _ in plain.events)  # off by default


class PlantedLaunch:
    """A spec whose launch notes whether it ran compile-only, and on which thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool, int]] = []

    def launch(self, config: Config, inputs: tuple, outputs: tuple) -> None:
        if config["BLOCK"] == 0:
            raise RuntimeError("does not compile")  # recorded when measured, not here
        self.calls.append((int(config["BLOCK"]), precompile.compiling(), threading.get_ident()))


def test_compile_all_launches_each_config_compile_only_on_pool_threads(monkeypatch) -> None:
    monkeypatch.setattr(precompile, "_INSTALLED", [True])
    monkeypatch.setattr(precompile.backend, "INTERPRETED", False)
    spec = PlantedLaunch()
    configs = [{"BLOCK": b} for b in (16, 0, 32, 64)]
    precompile.compile_all(spec, configs, (), (), threads=3)  # type: ignore[arg-type]
    assert sorted(b for b, _, _ in spec.calls) == [16, 32, 64]
    assert all(compile_only for _, compile_only, _ in spec.calls)
    assert threading.get_ident() not in {t for _, _, t in spec.calls} and not precompile.compiling()
    assert precompile.compile_all(spec, configs, (), (), threads=0) == 0.0  # type: ignore[arg-type]
    monkeypatch.setattr(precompile.backend, "INTERPRETED", True)
    spec.calls.clear()
    precompile.compile_all(spec, configs, (), (), threads=3)  # type: ignore[arg-type]
    assert spec.calls == []  # the interpreter compiles nothing: a launch would run the kernel


def test_an_isolation_worker_answers_a_precompile_request_and_measures_on(toy) -> None:
    """The request's round trip (in the interpreter the worker compiles nothing and says so)."""
    from toy_kernel import PlantedTimer

    from tunekit.tuning.bench import timer_to_json
    from tunekit.tuning.isolation import IsolatedBench

    timer = timer_to_json(PlantedTimer())
    assert timer is not None
    config = {"BLOCK": 16, "variant": "a", "num_warps": 4}
    with IsolatedBench(toy, {"rows": 8, "cols": 32, "dtype": "float32"}, 0, timer, 60.0) as bench:
        bench.precompile([config], 2)
        assert bench.last_phases == {"compile": 0.0} and bench.restarts == 0
        assert bench.measure(config, 1).status == "ok" and bench.started == 1
