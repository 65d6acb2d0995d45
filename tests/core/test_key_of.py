"""Each kernel's `key_of` (the problem key an op dispatches on, from the launch inputs) agrees with its
`problem_fields`: the key of a problem's own inputs is that problem's key."""

from __future__ import annotations

import pytest
from fingerprints import INTERPRETER

from tunekit.core.backend import torch_device
from tunekit.core.registry import get_spec, kernel_names

CASES = [(name, p) for name in kernel_names() for p in get_spec(name).default_problems(INTERPRETER)]


@pytest.mark.parametrize(("kernel", "problem"), CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_key_of_the_inputs_of_a_problem_is_its_key(kernel: str, problem: dict) -> None:
    spec = get_spec(kernel)
    key = spec.key_of(spec.make_inputs(problem, torch_device(), 0))
    assert key == spec.problem_key(problem)
    assert spec.problem_dict(key) == dict(problem)


def test_every_kernel_declares_its_model_and_dependent_parameters_within_its_space() -> None:
    for name in kernel_names():
        spec = get_spec(name)
        assert spec.model is not None, f"{name} declares no tile geometry for the quantization model"
        assert set(spec.model.family) <= set(spec.space.names)
        assert spec.dependent_params <= set(spec.space.names)
    assert get_spec("gemm").dependent_params == {"SPLIT_K", "GROUP_M"}
