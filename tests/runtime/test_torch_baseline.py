"""Every kernel's torch_baseline: torch's own ops, what its op runs where dispatch serves torch, checked against the
kernel's reference by the tuner's own output check (tunekit.tuning.verify.check_outputs) on the interpreter's
default problems, so the tuner can time it as a candidate next to the Triton configs."""

from __future__ import annotations

import pytest
import torch
from fingerprints import INTERPRETER

import tunekit.ops as ops
from tunekit.core.registry import get_spec, kernel_names
from tunekit.runtime import dispatch
from tunekit.runtime.dispatch import TORCH, Resolution
from tunekit.tuning.verify import check_outputs

CPU = torch.device("cpu")


def test_every_kernel_has_a_torch_baseline() -> None:
    assert [name for name in kernel_names() if get_spec(name).torch_baseline is None] == []


@pytest.mark.parametrize("kernel", kernel_names())
def test_torch_baseline_matches_the_reference(kernel: str) -> None:
    spec = get_spec(kernel)
    assert spec.torch_baseline is not None
    problems = spec.default_problems(INTERPRETER)
    assert problems
    for seed, problem in enumerate(problems):
        inputs = spec.make_inputs(problem, CPU, seed)
        got = spec.torch_baseline(inputs)
        assert isinstance(got, tuple) and all(isinstance(t, torch.Tensor) for t in got)
        expected = spec.reference(inputs)
        wrong = check_outputs(spec, got, expected)
        assert wrong is None, f"{kernel} {spec.describe_problem(problem)}: {wrong}"
        # The same structure as the kernel's outputs: what a launch writes, of the same shapes and dtypes, but for
        # max's indices (torch writes int64 where the spec allocates float64 to poison; compared exactly either way).
        allocated = spec.alloc_outputs(inputs)
        assert [t.shape for t in got] == [t.shape for t in allocated]
        for t, want in zip(got, allocated):
            assert t.dtype == want.dtype or (t.dtype == torch.int64 and want.dtype == torch.float64)


def _op_call(kernel: str, inputs: tuple) -> tuple[torch.Tensor, ...]:
    """The kernel's op called on the kernel's inputs (whose layout it passes to the kernel as they are)."""
    if kernel == "gemm":
        a, b, bias, residual, activation, alpha, beta = inputs
        return (ops.matmul(a, b, bias=bias, activation=activation, alpha=alpha, beta=beta, residual=residual),)
    if kernel == "layernorm":
        x, weight, bias, eps = inputs
        return (ops.layer_norm(x, (x.shape[1],), weight, bias, eps),)
    if kernel == "rmsnorm":
        x, weight, eps = inputs
        return (ops.rms_norm(x, (x.shape[1],), weight, eps),)
    if kernel == "softmax":
        x, log = inputs
        return ((ops.log_softmax if log else ops.softmax)(x, -1),)
    assert kernel == "reduction"
    x, op, _ = inputs
    return tuple(ops.max(x, 1)) if op == "max" else (getattr(ops, op)(x, 1),)


@pytest.mark.parametrize("kernel", ["gemm", "layernorm", "rmsnorm", "softmax", "reduction"])
def test_the_ops_torch_branch_computes_the_baseline(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where dispatch serves TORCH, the op runs the baseline's torch calls: the same bits."""
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    spec = get_spec(kernel)
    assert spec.torch_baseline is not None
    for seed, problem in enumerate(spec.default_problems(INTERPRETER)):
        inputs = spec.make_inputs(problem, CPU, seed)
        got, want = _op_call(kernel, inputs), spec.torch_baseline(inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w), f"{kernel} {spec.describe_problem(problem)}"
