"""Timing a model's steps: a step's call as tune_model runs it, its median time, and several servings of one step timed
in alternation (interleaved rounds, the ratio of two servings as the median of per-round ratios)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch

Step = Callable[[torch.nn.Module], Any]
StepTimer = Callable[[Callable[[], Any], int], float]  # (a call, reps) -> its median ms


def median_ms(call: Callable[[], Any], reps: int, on_gpu: bool = True) -> float:
    """The median of `reps` calls, ms: CUDA events around each call on a GPU, the host clock elsewhere."""
    times = []
    for _ in range(reps):
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def default_timer(model: torch.nn.Module) -> StepTimer:
    """`median_ms` on the model's device."""
    on_gpu = any(p.is_cuda for p in model.parameters())
    return lambda call, reps: median_ms(call, reps, on_gpu)


class Alternation:
    """Times one step under several servings, interleaved: each round runs every serving once (warm-up calls, then
    `reps` timed), in an order that rotates per round so no serving always follows the same one."""

    def __init__(self, timer: StepTimer, rounds: int, reps: int, warmup: int = 2) -> None:
        self.timer, self.rounds, self.reps, self.warmup = timer, rounds, reps, warmup

    def run(self, calls: Mapping[str, tuple[Callable[[], Any], Callable[[], AbstractContextManager[Any]]]]) -> dict:
        names = list(calls)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(self.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                call, context = calls[name]
                with context():
                    for _ in range(self.warmup):
                        call()
                    times[name].append(self.timer(call, self.reps))
        return times


def ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median of per-round num/den time ratios: > 1 when `den` is faster."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def output_tensor(out: Any) -> torch.Tensor | None:
    """The tensor a step's output compares by: logits (an attribute), a tensor, or a tuple's first tensor."""
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((t for t in out if isinstance(t, torch.Tensor)), None)
    return None


def step_call(m: torch.nn.Module, step: Step) -> Callable[[], Any]:
    """One run of `step` on `m`, its gradients dropped after (a training step's own zero_grad)."""

    def call() -> Any:
        out = step(m)
        m.zero_grad(set_to_none=True)
        return out

    return call
