"""Measuring a user kernel's candidates for one launch's problem.

- A config list is measured the way triton.autotune measures it (pruned by `prune_configs_by`, then every config
  timed on the launch's own arguments with the hooks), each config first checked against the reference where one is
  given. A config that fails to compile or run, or gives wrong results, is recorded and never served.
- A space is searched by tunekit's tuner (Optuna, a trial budget), every candidate verified like tunekit's own.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from triton import Config as TritonConfig

from tunekit.core import backend
from tunekit.core.errors import TunekitError
from tunekit.core.space import Config, Value, config_id
from tunekit.core.spec import Tolerance
from tunekit.store.entry import Entry, TrialRecord
from tunekit.tuning.bench import CudaEventTimer, Timer, default_timer
from tunekit.tuning.verify import KNOWN_KERNEL_FAILURES, failure, verify_config
from tunekit.user_kernels.configs import Candidates, as_dict
from tunekit.user_kernels.launch import Call, Hooks, launch
from tunekit.user_kernels.stored import StoredKernel, describe
from tunekit.user_kernels.verify import Reference, UserSpec, user_spec

logger = logging.getLogger("tunekit")

DoBench = Callable[..., Any]


class DoBenchTimer:
    """A triton-style `do_bench(fn, quantiles=...)` as a tunekit Timer (the median is the time)."""

    label = "do_bench"

    def __init__(self, do_bench: DoBench) -> None:
        self.do_bench = do_bench

    def __call__(self, fn: Callable[[], object], config: Config) -> float:
        result = self.do_bench(fn, quantiles=(0.5, 0.2, 0.8))
        return float(result[0] if isinstance(result, (list, tuple)) else result)


def make_timer(
    do_bench: DoBench | None, warmup: float | None, rep: float | None, use_cuda_graph: bool = False
) -> Timer:
    """triton.autotune's timer: on a GPU, `use_cuda_graph` or `warmup`/`rep` (its older interface) take precedence
    over `do_bench`, as there. In the interpreter there is no GPU timer: `do_bench`, else wall-clock time."""
    if not backend.INTERPRETED:
        if use_cuda_graph:
            return DoBenchTimer(functools.partial(_cuda_graph_bench, rep=rep or 100.0))
        if warmup is not None or rep is not None:
            return CudaEventTimer(warmup_ms=warmup or 25.0, rep_ms=rep or 100.0)
    if do_bench is not None:
        return DoBenchTimer(do_bench)
    return default_timer()


def _cuda_graph_bench(fn: Callable[[], object], quantiles: Any, rep: float) -> Any:
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=rep, quantiles=quantiles)


@dataclass
class Searcher:
    """Everything measuring needs besides the launch: the kernel, its candidates and how to check and time them."""

    name: str
    fn: Any
    candidates: Candidates
    hooks: Hooks
    timer: Timer
    reference: Reference | None
    tolerances: Mapping[str, Tolerance]
    prune_configs_by: Mapping[str, Any] | None
    trials: int
    count: Callable[[int], None] = field(default=lambda n: None)  # benchmarks run, for the kernel's counters

    def _spec(self, stored: StoredKernel, call: Call, problem: dict[str, Value]) -> UserSpec:
        by_id = self.candidates.by_id()
        return user_spec(
            self.name,
            self.fn,
            call,
            self.candidates,
            self.hooks,
            stored.identity,
            tuple(problem),
            self.reference,
            self.tolerances,
            lambda config: by_id.get(config_id(config)),
        )

    def check(self, stored: StoredKernel, call: Call, problem: dict[str, Value], config: Config) -> str | None:
        """A stored config that was not measured here (imported, or in a package's database), run once on fresh
        copies of the call's arguments with its outputs poisoned and compared with the reference (without one, it
        must run): None when it passes, else why not."""
        try:
            return verify_config(self._spec(stored, call, problem), dict(config), problem, _device_of(call), seed=1)
        except KNOWN_KERNEL_FAILURES as exc:
            return f"fails here: {type(exc).__name__}: {str(exc)[:200]}"

    def measure(
        self, stored: StoredKernel, call: Call, problem: dict[str, Value], pruned: list[TritonConfig] | None = None
    ) -> Entry:
        """The best candidate for `call`'s problem, as an entry (not yet stored); a config list's `pruned` configs
        when already pruned. Raises one line when none works."""
        spec = self._spec(stored, call, problem)
        if self.candidates.space is not None:
            return self._search(spec, stored, problem)
        records: list[TrialRecord] = []
        device = _device_of(call)
        for config in self.prune(call) if pruned is None else pruned:
            data = as_dict(config)
            try:
                wrong = verify_config(spec, data, problem, device, seed=1) if self.reference is not None else None
                if wrong is not None:
                    records.append(TrialRecord(data, "wrong", error=wrong))
                    continue
                self.count(1)
                ms = self.timer(functools.partial(launch, self.fn, call, config, self.hooks), data)
                records.append(TrialRecord(data, "ok", time_ms=float(ms)))
            except KNOWN_KERNEL_FAILURES as exc:
                records.append(failure(data, exc))
        self._say_rejected(records)
        ok = [r for r in records if r.status == "ok" and r.time_ms is not None]
        if not ok:
            raise TunekitError(f"{self.name}: every config failed or gave wrong results for {describe(problem)}")
        best = min(ok, key=lambda r: r.time_ms or 0.0)
        return stored.entry(problem, best, records, self.timer.label)

    def prune(self, call: Call) -> list[TritonConfig]:
        """triton.autotune's pruning: `early_config_prune(configs, named_args, **kwargs)` (the arguments passed by
        position, then those passed by name), then the `perf_model`'s `top_k` (a float <= 1: that fraction of the
        configs left, at least one)."""
        configs = list(self.candidates.configs)
        options = dict(self.prune_configs_by or {})
        early = options.get("early_config_prune")
        if early is not None:
            named_args, kwargs = call.as_triton_passes()
            configs = list(early(configs, named_args, **kwargs))
            if not configs:
                raise TunekitError(
                    f"{self.name}: No valid autotuner configs after pruning. `early_config_prune` should return at "
                    "least one config"
                )
        perf_model, top_k = options.get("perf_model"), options.get("top_k", 1.0)
        if perf_model is not None:
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = max(1, int(len(configs) * top_k))
            if not isinstance(top_k, int):
                raise TunekitError(f"{self.name}: prune_configs_by top_k must be an int or a float <= 1, got {top_k!r}")
            if len(configs) > top_k:
                est = {id(c): perf_model(**call.named, **call.extra, **c.all_kwargs()) for c in configs}
                configs = sorted(configs, key=lambda c: est[id(c)])[:top_k]
        return configs

    def _search(self, spec: Any, stored: StoredKernel, problem: dict[str, Value]) -> Entry:
        from tunekit.tuning.tune_types import TuneOptions
        from tunekit.tuning.tuner import tune

        options = TuneOptions(trials=self.trials, sampler="tpe", isolate=False, remeasure_top=1)
        report = tune(spec, problem, stored.device, options, timer=self.timer)
        self.count(report.benchmarked)
        self._say_rejected(report.records)
        return report.entry

    def _say_rejected(self, records: list[TrialRecord]) -> None:
        for record in records:
            if record.status != "ok":
                what = "fails" if record.status == "failed" else "gives wrong results"
                logger.warning(
                    "tunekit: %s: config %s %s (%s); never served", self.name, record.config, what, record.error
                )


def _device(value: Any) -> torch.device | None:
    return value.device if isinstance(value, torch.Tensor) else None


def _device_of(call: Call) -> torch.device:
    found = [d for d in map(_device, call.named.values()) if d is not None]
    return found[0] if found else backend.torch_device()
