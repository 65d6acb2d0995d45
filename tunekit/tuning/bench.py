"""Timers. A timer answers 'how long does this launch take' in milliseconds; the tuner never times directly.

The tuner passes the config too, so tests can plant timings with a fake timer (as Triton's autotuner tests do).
"""

from __future__ import annotations

import importlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from tunekit.core import backend
from tunekit.core.space import Config
from tunekit.store.entry import GPU_TIMER, HOST_FLOOR_MS


class Timer(Protocol):
    label: str

    def __call__(self, fn: Callable[[], object], config: Config) -> float: ...


# Under this much GPU time a call may be bound by the host's work: the timer then also counts a call's host cost.
HOST_CHECK_MS = HOST_FLOOR_MS


class CudaEventTimer:
    """CUDA events through triton.testing.do_bench: warm-up, L2 flushed before every repetition, median.

    A launch-bound problem (GPU time under `host_check_ms`) is also timed as calls made back to back, the way an
    eager loop makes them, and scores the slower of the two: there the host's work per call is what a user waits
    on, and a 5 us kernel behind 30 us of host work must not win a race of CUDA events it loses in use."""

    label = GPU_TIMER

    def __init__(self, warmup_ms: float = 25.0, rep_ms: float = 100.0, host_check_ms: float = HOST_CHECK_MS) -> None:
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.host_check_ms = host_check_ms

    def __call__(self, fn: Callable[[], object], config: Config) -> float:
        import triton.testing

        ms = float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        if ms < self.host_check_ms:
            ms = max(ms, back_to_back_ms(fn))
        return ms


def back_to_back_ms(fn: Callable[[], object], calls: int = 200, repeats: int = 3) -> float:
    """Milliseconds per call of `calls` calls made back to back, then one synchronize (median of `repeats`): the
    larger of the host's time per call and the GPU's, as an eager loop sees it (L2 warm, as in such a loop)."""
    import torch

    for _ in range(10):
        fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(samples)


class WallClockTimer:
    """Interpreter timing: host wall-clock, median of a few runs after one warm-up. Not GPU performance."""

    label = "interpreter-wall-clock"

    def __init__(self, repeats: int = 3) -> None:
        self.repeats = repeats

    def __call__(self, fn: Callable[[], object], config: Config) -> float:
        fn()
        samples = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)


def default_timer() -> Timer:
    return WallClockTimer() if backend.INTERPRETED else CudaEventTimer()


# A plan tuned against a wall-time budget (`tune --plan --budget`) times each candidate over shorter windows: most of
# a small problem's tuning time is the timer's fixed 25 ms of warm-up and 100 ms of repetitions per candidate (and
# per torch timing). 25 ms of repetitions is still over a hundred L2-flushed samples of a 10-100 us kernel.
BUDGET_WARMUP_MS, BUDGET_REP_MS = 10.0, 25.0


def budget_timer() -> Timer:
    """The timer of a plan tuned under `--budget`: the default timer's method, over shorter windows."""
    return WallClockTimer() if backend.INTERPRETED else CudaEventTimer(BUDGET_WARMUP_MS, BUDGET_REP_MS)


def is_builtin_timer(timer: object) -> bool:
    """A real timer of this module (the tuner isolates these by default; custom/fake timers run in-process)."""
    return isinstance(timer, (CudaEventTimer, WallClockTimer))


def timer_to_json(timer: object) -> dict[str, Any] | None:
    """How a timer crosses into the isolated worker: its class's import path and its JSON attributes.

    None when it cannot (a local class, a closure, or state that is not JSON): such a timer runs in-process only.
    """
    cls = type(timer)
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        return None
    try:
        state = json.loads(json.dumps(vars(timer), allow_nan=False))
    except (TypeError, ValueError):
        return None
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "state": state}


def timer_from_json(data: dict[str, Any]) -> Timer:
    module_name, _, qualname = str(data["class"]).partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    timer: Timer = obj.__new__(obj)
    vars(timer).update(data["state"])
    return timer
