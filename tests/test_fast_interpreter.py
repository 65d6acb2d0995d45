"""The test suite's cheaper interpreter (tests/fast_interpreter.py) computes what Triton's own does: a forward and
backward through several kernels (device functions inside them included) give bit-equal results both ways."""

from __future__ import annotations

import fast_interpreter
import pytest
import torch
import triton
from triton.runtime import interpreter

import tunekit


def _run() -> list[torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(6, 96, requires_grad=True)
    w = torch.randn(96, requires_grad=True)
    b = torch.randn(96, requires_grad=True)
    weight = torch.randn(40, 96)
    y = tunekit.ops.layer_norm(x, (96,), w, b, 1e-5)
    z = tunekit.ops.linear(y, weight.requires_grad_(), None)
    z.square().sum().backward()
    return [y.detach(), z.detach(), x.grad, w.grad, b.grad, weight.grad]


@pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="written for Triton 3.6's interpreter")
def test_the_cheaper_interpreter_computes_what_tritons_own_does(monkeypatch) -> None:
    from conftest import FAST_INTERPRETER

    assert FAST_INTERPRETER and fast_interpreter.ORIGINAL  # installed for the suite on this Triton
    fast = _run()
    monkeypatch.setattr(interpreter, "_patch_builtin", fast_interpreter.ORIGINAL["patch_builtin"])
    monkeypatch.setattr(interpreter.interpreter_builder, "options", fast_interpreter.ORIGINAL["options"])
    assert interpreter.interpreter_builder.options.sanitize_overflow
    plain = _run()
    assert all(torch.equal(a, b) for a, b in zip(fast, plain, strict=True))
