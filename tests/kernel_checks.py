"""What the kernel test modules share: where they launch, the interpreter's noise they silence, a launch into
poisoned outputs and the check that a heuristic's config belongs to its space and breaks none of its rules (for one
problem, or a grid of row kernels' problems)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from tunekit.core.backend import torch_device
from tunekit.core.device import DeviceFingerprint, fingerprint
from tunekit.core.space import Problem, Value
from tunekit.core.spec import Inputs, KernelSpec, Outputs

HERE = fingerprint()  # where the tests launch kernels: the interpreter, or a GPU when there is one
DEV = torch_device()

# Interpreter-only noise: NaN arithmetic in masked-off lanes, and numpy's deprecation of Triton's scalar __index__.
INTERPRETER_NOISE = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
]


def launch_poisoned(spec: KernelSpec, config: dict, inputs: Inputs) -> Outputs:
    """Launch through the spec into NaN-filled outputs (an element the kernel skips stays NaN and fails the check)."""
    outputs = spec.alloc_outputs(inputs)
    for out in outputs:
        out.fill_(math.nan)
    spec.launch(config, inputs, outputs)
    return outputs


def assert_heuristic_valid(spec: KernelSpec, problem: Problem, device: DeviceFingerprint) -> None:
    """The heuristic's config names exactly the space's parameters, with values in it, and breaks no rule."""
    config = spec.heuristic(problem, device)
    assert spec.space.check_membership(config) == config
    assert spec.space.violations(config, problem, device) == [], (problem, device.name, config)


def assert_heuristic_valid_on_grid(
    spec: KernelSpec, device: DeviceFingerprint, rows: Sequence[int], cols: Sequence[int], **fields: Value
) -> None:
    """assert_heuristic_valid for every problem of a row kernel with `rows` x `cols` and the other `fields` fixed."""
    for r in rows:
        for c in cols:
            assert_heuristic_valid(spec, {"rows": r, "cols": c, **fields}, device)
