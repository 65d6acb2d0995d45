"""What the tuner times: a candidate's launch as an eager call replays it (tunekit.tuning.verify.as_called_eagerly),
and the GPU timer's per-call floor for launch-bound problems (tunekit.tuning.bench.CudaEventTimer)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.tuning import bench
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
    inputs = spec.make_inputs(problem, CPU, seed)
    outputs = spec.alloc_outputs(inputs)
    return spec, spec.heuristic(problem, fingerprint()), inputs, outputs


def test_a_replayable_launch_is_timed_through_its_replay() -> None:
    spec, config, inputs, outputs = _layernorm_case(0)
    counting = CountingLaunch("layernorm")
    fn = as_called_eagerly(counting, config, inputs, outputs)  # type: ignore[arg-type]
    assert counting.calls == 1  # the one watched launch
    (expected,) = spec.reference(inputs)
    for _ in range(2):
        outputs[0].fill_(math.nan)
        fn()
        torch.testing.assert_close(outputs[0], expected.to(outputs[0].dtype), atol=1e-4, rtol=1e-4)
    assert counting.calls == 1  # the replay fired the compiled launch; the spec's host path did not run again


def test_a_launch_no_plan_replays_is_timed_as_itself() -> None:
    _, config, inputs, outputs = _layernorm_case(1)
    counting = CountingLaunch("layernorm", torch_op_first=True)
    fn = as_called_eagerly(counting, config, inputs, outputs)  # type: ignore[arg-type]
    fn()
    assert counting.calls == 2


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
