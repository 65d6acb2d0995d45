"""Backward problems in plans (issue 17): recording a training step gives a plan with the backward problems next to
the forward ones, `tunekit tune --plan` tunes them like any problem, and dispatch then serves the tuned entries."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import cli

import tunekit
import tunekit.ops as ops
from tunekit.fleet.plans import read_plan
from tunekit.runtime import dispatch


def _training_step() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=gen, requires_grad=True)
    ln_w, ln_b, rms_w = (torch.randn(64, generator=gen, requires_grad=True) for _ in range(3))
    weight = torch.randn(32, 64, generator=gen, requires_grad=True)
    bias = torch.randn(32, generator=gen, requires_grad=True)
    h = ops.layer_norm(x, (64,), ln_w, ln_b)
    h = ops.rms_norm(h, (64,), rms_w, 1e-6)
    y = ops.linear(h, weight, bias, "gelu")
    y.square().sum().backward()


def test_a_recorded_training_step_tunes_its_backward_problems(tmp_path: Path) -> None:
    plan = tmp_path / "plan.jsonl"
    with tunekit.record_problems(plan):
        _training_step()
    kernels = [kernel for kernel, _ in read_plan(plan)]
    assert {"layernorm_backward", "rmsnorm_backward"} <= set(kernels), kernels
    gemms = [problem for kernel, problem in read_plan(plan) if kernel == "gemm"]
    # the forward GEMM (with its activation, and without: training splits the activation off) and the two backward
    # problems, dX = dY W (row x row) and dW = X^T dY (col x row)
    layouts = {(g["a_layout"], g["b_layout"], g["activation"]) for g in gemms}
    assert {("row", "row", "none"), ("col", "row", "none"), ("row", "col", "gelu")} <= layouts, layouts

    result = cli("tune", "--plan", str(plan), "--trials", "2")
    assert result.exit_code == 0, result.output
    dispatch.reset_all()
    with tunekit.record_problems(tmp_path / "again.jsonl"):
        _training_step()  # every problem resolves again: now from the store
    for name in ("layernorm_backward", "rmsnorm_backward", "gemm"):
        served = set(dispatch.dispatcher(name).served_by.values())
        assert served == {"cache"}, (name, served)


def test_an_untuned_gpu_records_the_backward_gemms_too(tmp_path: Path, monkeypatch) -> None:
    """On a GPU where torch serves the untuned forward GEMM (and so trains the call), the recording still holds the
    two backward problems: the plan tunes them, after which they may serve."""
    import dataclasses

    from fingerprints import H200

    monkeypatch.setattr(dispatch, "fingerprint", lambda: dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3"))
    dispatch.reset_all()
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(8, 64, generator=gen, requires_grad=True), torch.randn(32, 64, generator=gen)
    with tunekit.record_problems(tmp_path / "plan.jsonl"):
        ops.linear(x, weight.requires_grad_()).sum().backward()
    dispatch.reset_all()
    layouts = {(g["a_layout"], g["b_layout"]) for k, g in read_plan(tmp_path / "plan.jsonl") if k == "gemm"}
    assert {("row", "col"), ("row", "row"), ("col", "row")} <= layouts, layouts
