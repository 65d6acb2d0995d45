"""Benchmark report: the dispatched (tuned) config against the heuristic default, torch and the copy roofline.

Timings as the tuner takes them (CUDA events, warm-up, L2 flushed, median); bandwidth counts the spec's
minimum bytes moved; every ratio is against baselines measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tunekit import backend
from tunekit.bench import Timer, default_timer
from tunekit.device import fingerprint
from tunekit.dispatch import dispatcher
from tunekit.registry import get_spec
from tunekit.space import Problem
from tunekit.spec import KernelSpec
from tunekit.verify import check_outputs, poison


@dataclass(frozen=True)
class Row:
    problem: str
    layer: str
    tuned_ms: float
    heuristic_ms: float
    torch_ms: float | None
    bytes_moved: int
    correct: bool

    def gbps(self, ms: float | None) -> float | None:
        return None if ms is None else self.bytes_moved / (ms * 1e-3) / 1e9


def copy_bandwidth_gbps(timer: Timer, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, counting bytes read plus bytes written (the practical memory roofline)."""
    device = backend.torch_device()
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), {})
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure_problem(spec: KernelSpec, problem: Problem, timer: Timer) -> Row:
    device = fingerprint()
    d = dispatcher(spec.name)
    key = spec.problem_key(problem)
    tuned = d.config(key)
    inputs = spec.make_inputs(problem, backend.torch_device(), 1234)
    outputs = spec.alloc_outputs(inputs)
    for out in outputs:
        poison(out)
    spec.launch(tuned, inputs, outputs)
    correct = check_outputs(spec, outputs, spec.reference(inputs)) is None
    heuristic = spec.heuristic(problem, device)
    tuned_ms = timer(lambda: spec.launch(tuned, inputs, outputs), tuned)
    heuristic_ms = timer(lambda: spec.launch(heuristic, inputs, outputs), heuristic)
    baseline = spec.torch_baseline
    torch_ms = timer(lambda: baseline(inputs), {}) if baseline is not None else None
    return Row(
        spec.describe_problem(problem),
        d.served_by[key],
        tuned_ms,
        heuristic_ms,
        torch_ms,
        spec.bytes_moved(problem),
        correct,
    )


def run_report(kernel: str, problems: list[Problem] | None = None) -> tuple[float, list[Row]]:
    spec = get_spec(kernel)
    timer = default_timer()
    problems = problems if problems is not None else spec.default_problems(fingerprint())
    copy = copy_bandwidth_gbps(timer) if not backend.INTERPRETED else float("nan")
    return copy, [measure_problem(spec, p, timer) for p in problems]
