"""What the tuner times: a candidate's launch as a user's eager call of its op runs it, through the hot path's
signature and plan (tunekit.tuning.verify.as_called_eagerly); torch's op on the inputs its commonest call passes
(tunekit.tuning.torch_candidate); and the GPU timer's per-call floor for launch-bound problems
(tunekit.tuning.bench.CudaEventTimer)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from tunekit.core import backend
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.launch import plan
from tunekit.tuning import bench, torch_candidate, verify
from tunekit.tuning.bench import CudaEventTimer
from tunekit.tuning.verify import as_called_eagerly

CPU = torch.device("cpu")


class CountingLaunch:
    """A kernel spec whose launch counts its calls (and may run a torch op first, which no plan replays)."""

    def __init__(self, name: str, torch_op_first: bool = False) -> None:
        self.spec = get_spec(name)
        self.calls = 0
        self.torch_op_first = torch_op_first

    def launch(self, config: Any, inputs: Any, outputs: Any) -> None:
        self.calls += 1
        if self.torch_op_first:
            outputs[0].zero_()
        self.spec.launch(config, inputs, outputs)


def _layernorm_case(seed: int) -> tuple[Any, dict[str, Any], tuple[Any, ...], tuple[torch.Tensor, ...]]:
    spec = get_spec("layernorm")
    problem = {"rows": 16, "cols": 96, "dtype": "float32", "weight": True, "bias": True}
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)  # the GPU where there is one
    outputs = spec.alloc_outputs(inputs)
    return spec, spec.heuristic(problem, fingerprint()), inputs, outputs


def test_a_replayable_launch_is_timed_through_the_hot_path_and_its_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    spec, config, inputs, outputs = _layernorm_case(0)
    counting = CountingLaunch("layernorm")
    fn = as_called_eagerly(counting, config, inputs, outputs)  # type: ignore[arg-type]
    assert counting.calls == 1  # the watched launch
    signatures: list[int] = []
    real_signature = plan.call_signature
    monkeypatch.setattr(verify, "call_signature", lambda *a: signatures.append(1) or real_signature(*a))
    (expected,) = spec.reference(inputs)
    for _ in range(2):
        outputs[0].fill_(math.nan)
        fn()
        torch.testing.assert_close(outputs[0], expected.to(outputs[0].dtype), atol=1e-4, rtol=1e-4)
    assert counting.calls == 1  # the replay fired the compiled launch; the spec's host path did not run again
    assert len(signatures) == 2  # each timed call paid the hot path's per-call work, as a user's call does


def test_a_launch_no_plan_replays_is_timed_as_itself() -> None:
    _, config, inputs, outputs = _layernorm_case(1)
    counting = CountingLaunch("layernorm", torch_op_first=True)
    fn = as_called_eagerly(counting, config, inputs, outputs)  # type: ignore[arg-type]
    fn()
    assert counting.calls == 2


def test_torch_is_timed_on_the_inputs_of_its_commonest_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMM's bench inputs scale by alpha = 0.75 (so a kernel ignoring alpha fails verification); a linear call
    passes alpha = beta = 1, where torch's mm needs no second pass over the output: torch is timed on those."""
    spec = get_spec("gemm")
    seen: list[tuple[float, float]] = []

    def baseline(inputs: Any) -> Any:
        seen.append((inputs[5], inputs[6]))
        return spec.torch_baseline(inputs)  # type: ignore[misc]

    monkeypatch.setattr(torch_candidate.backend, "INTERPRETED", False)
    monkeypatch.setattr(torch_candidate.backend, "torch_device", lambda: CPU)
    timed = dataclasses.replace(spec, torch_baseline=baseline)
    problem = spec.problem_from_shape((8, 64, 32), "float32")
    assert spec.make_inputs(problem, CPU, 0)[5:] == (0.75, 0.5)  # what verification checks the kernel on
    ms = torch_candidate.time_torch(timed, problem, 0, lambda fn, config: fn() and 0.25)  # type: ignore[arg-type]
    assert ms == 0.25 and seen == [(1.0, 1.0)]
    untouched = dataclasses.replace(timed, torch_timing_inputs=None)  # a kernel without one: the bench inputs
    torch_candidate.time_torch(untouched, problem, 0, lambda fn, config: fn() and 0.25)  # type: ignore[arg-type]
    assert seen[-1] == (0.75, 0.5)


@pytest.mark.parametrize(("gpu_ms", "floor_ms", "expected"), [(0.005, 0.03, 0.03), (0.05, 0.01, 0.05), (0.5, 9.0, 0.5)])
def test_launch_bound_problems_score_their_per_call_floor(
    gpu_ms: float, floor_ms: float, expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triton.testing

    floors: list[int] = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **_: gpu_ms)
    monkeypatch.setattr(bench, "back_to_back_ms", lambda fn: floors.append(1) or floor_ms)
    assert CudaEventTimer()(lambda: None, {}) == expected
    assert len(floors) == (1 if gpu_ms < 0.1 else 0)  # past host_check_ms the host is hidden behind the GPU
