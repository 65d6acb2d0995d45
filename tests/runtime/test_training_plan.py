"""Backward problems in plans: recording a training step gives a plan with the backward problems next to
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


def test_an_untuned_gpu_records_the_training_forwards_of_norms_rope_and_pointwise(tmp_path: Path, monkeypatch) -> None:
    """Where torch trains a norm, RoPE or pointwise call (its backward untuned on a GPU), the recording still holds
    the forward problem next to the backward: once both are tuned the call runs the forward kernel, so a plan (a
    model pack) recorded untuned covers what the tuned model runs."""
    import dataclasses

    from fingerprints import H200

    monkeypatch.setattr(dispatch, "fingerprint", lambda: dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3"))
    dispatch.reset_all()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 64, generator=gen, requires_grad=True)
    w, b = torch.randn(64, generator=gen, requires_grad=True), torch.randn(64, generator=gen, requires_grad=True)
    q = torch.randn(2, 4, 6, 16, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 6, 16, generator=gen, requires_grad=True)
    cos, sin = torch.randn(2, 6, 16, generator=gen), torch.randn(2, 6, 16, generator=gen)
    with tunekit.record_problems(tmp_path / "plan.jsonl", buckets=False):
        h = ops.rms_norm(x, (64,), w, 1e-6) + ops.layer_norm(x, (64,), w, b)
        qe, ke = ops.rotary_embedding(q, k, cos, sin)
        g = ops.bias_act(x, b, "gelu")
        (h.square().sum() + qe.sum() + ke.sum() + g.sum()).backward()
    dispatch.reset_all()
    recorded = {}
    for kernel, problem in read_plan(tmp_path / "plan.jsonl"):
        recorded.setdefault(kernel, []).append(problem)
    for name in ("rmsnorm", "layernorm", "rope", "pointwise"):
        assert len(recorded.get(name, [])) == 1 and len(recorded.get(name + "_backward", [])) == 1, recorded.keys()
    assert recorded["rmsnorm"][0]["rows"] == recorded["rmsnorm_backward"][0]["rows"]
    assert recorded["rope"][0]["rows"] == recorded["rope_backward"][0]["rows"]
