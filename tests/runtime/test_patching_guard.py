"""tunekit.patch's guard at the call: a swap decided by probing runs tunekit's code only for call signatures where
its output conforms to the original's (dtype, shape, layout class, device, values); other calls run the original,
and the report says which and why (in the interpreter)."""

from __future__ import annotations

import pytest
import torch

from tunekit.integrations import patching_guard
from tunekit.integrations.patching import patch, unpatch
from tunekit.integrations.patching_guard import CallGuard, mismatch, signature


class _UpcastRMSNorm(torch.nn.Module):
    """An RMSNorm that returns fp32 for an fp16 input (its statistics kept from overflowing): tunekit's kernel
    would return fp16."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n) * 0.1 + 1)
        self.eps = 1e-6

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h * self.weight.float() if x.dtype == torch.float16 else h.to(x.dtype) * self.weight


class _RMSNorm(_UpcastRMSNorm):
    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


@pytest.fixture
def tunekit_norm_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.dtype, int]]:
    """(dtype, rank) of each input tunekit's norm forward ran for."""
    from tunekit import nn as tk_nn

    calls: list[tuple[torch.dtype, int]] = []
    real = tk_nn.found_norm_forward

    def counted(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        calls.append((x.dtype, x.dim()))
        return real(module, x)

    monkeypatch.setattr(patching_guard, "_module_conformance", {})
    monkeypatch.setattr(tk_nn, "found_norm_forward", counted)
    return calls


def test_a_norm_whose_output_dtype_differs_keeps_its_own_forward(tunekit_norm_calls: list) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_UpcastRMSNorm(48)).bfloat16()
    report = patch(model)
    assert [k for _, k in report.swapped] == ["RMSNorm (by structure)"] and report.skipped == []
    model.half()  # a dtype it was not checked in, and where its output dtype is not its input's
    x = torch.randn(2, 5, 48).half()
    with torch.no_grad():
        expected = _UpcastRMSNorm.forward(model[0], x)
        got = [model(x) for _ in range(2)]
    assert all(g.dtype == expected.dtype == torch.float32 and torch.equal(g, expected) for g in got)
    assert tunekit_norm_calls == [(torch.bfloat16, 3), (torch.float16, 3)]  # patch's check, the call's check
    ((path, why),) = report.skipped
    assert path == "0" and "input float16 (3-D), weight float16" in why and "its own float32" in why
    assert "  skipped 0: RMSNorm (by structure) with input float16 (3-D)" in str(report)
    unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_a_call_unlike_the_checked_ones_is_checked_at_the_call(tunekit_norm_calls: list) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_RMSNorm(48))
    report = patch(model)
    assert report.skipped == [] and tunekit_norm_calls == [(torch.float32, 3)]  # patch checked [batch, rows, 48]
    rows = torch.randn(7, 48)
    with torch.no_grad():
        expected = _RMSNorm.forward(model[0], rows)
        for _ in range(3):  # a 2-D input: checked once (tunekit's and its own), then tunekit's
            torch.testing.assert_close(model(rows), expected, atol=1e-5, rtol=1e-5)
    assert tunekit_norm_calls[1:] == [(torch.float32, 2)] * 4
    with torch.no_grad():
        model.bfloat16()  # now bf16 weights: a new signature, checked, conforms
        half = rows.bfloat16()
        assert model(half).dtype == torch.bfloat16
    assert tunekit_norm_calls[5:] == [(torch.bfloat16, 2)] * 2 and report.skipped == []


def test_the_verdict_of_the_last_signature_is_a_tuple_compare() -> None:
    guard = CallGuard("attn", "RoPE")
    x = torch.randn(2, 3)
    sig = signature(x, x.double(), 1)
    assert guard.verdict(sig) is None
    calls: list[str] = []

    def tunekit() -> torch.Tensor:
        calls.append("tunekit")
        return x.float()

    def own() -> torch.Tensor:
        calls.append("own")
        return x.double()

    assert guard.check(sig, tunekit, own, lambda: "x of float32") is False
    assert guard.verdict(sig) is False and guard.verdict(signature(x, x.double(), 1)) is False
    assert calls == ["own", "tunekit"] and guard.mismatched
    assert guard.skipped == [("attn", "RoPE with x of float32: its own code runs (tunekit's output is float32 (2, "
                              "3) on cpu, its own float64 (2, 3) on cpu)")]  # fmt: skip
    assert signature(x.t(), x) == signature(x, x)  # layouts are the output check's, not the signature's


@pytest.mark.parametrize(
    ("got", "want", "reason"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 3), None),
        (torch.zeros(2, 3), torch.zeros(3, 2).t(), "laid out"),
        (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float16), "float32 (2, 3) on cpu, its own float16"),
        ((torch.ones(4),), (torch.ones(4), torch.ones(4)), "no tensor or tuple of tensors"),
        (torch.ones(4), torch.ones(4) * 1.01, "values differ"),
        (torch.ones(4).bfloat16(), torch.ones(4).bfloat16() * 1.01, None),  # within bf16's tolerance
    ],
)
def test_mismatch_names_what_differs(got, want, reason) -> None:
    found = mismatch(got, want)
    assert found is None if reason is None else reason in (found or "")


def test_the_report_says_what_it_skipped_and_counts_in_words() -> None:
    from tunekit.integrations.patching import PatchReport

    report = PatchReport(
        swapped=[("a", "Linear")],
        fused=[("a", "silu")],
        skipped=[(f"layers.{i}.norm", "a LayerNorm subclass with its own forward") for i in range(5)] + [("x", "y")],
    )
    assert str(report).splitlines() == [
        "tunekit.patch: swapped 1 Linear; fused 1 activation; skipped 6",
        "  skipped layers.0.norm, layers.1.norm, layers.2.norm and 2 more: a LayerNorm subclass with its own forward",
        "  skipped x: y",
    ]
