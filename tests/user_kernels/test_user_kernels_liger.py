"""A real client: Liger-Kernel's single-block softmax forward kernel (a pip-installable project nobody here wrote),
wrapped with tunekit.autotune at run time, without copying its code. Same output as Liger's own launcher; a config
whose block cannot cover a row is caught by the reference; a second kernel object (as in a new process) measures
nothing.

Liger 0.8.5's RMSNorm, LayerNorm and SwiGLU forward kernels call `.to` on a Python float argument, which Triton
3.6's interpreter cannot run (their own launchers fail on CPU the same way): softmax is the one that runs here.
tests/gpu/autotune_client.py runs RMSNorm and SwiGLU on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton

import tunekit

softmax = pytest.importorskip(
    "liger_kernel.ops.softmax", reason="liger-kernel is not installed (pip install liger-kernel==0.8.5 --no-deps)"
)

ROWS, COLS = 3, 100
# BLOCK_SIZE=64 covers only 64 of a row's 100 columns: wrong, and the reference says so.
CONFIGS = [triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b, w in ((64, 1), (128, 2), (256, 4))]


def _reference(args: dict) -> dict:
    return {"Y_ptr": torch.softmax(args["X_ptr"].float(), dim=-1)}


def _wrapped():
    fake_times = iter([2.0, 1.0] * 4)  # the interpreter has no GPU timer: the second config timed is the fastest
    return tunekit.autotune(
        configs=CONFIGS,
        key=["n_cols"],
        reference=_reference,
        do_bench=lambda fn, quantiles=None: (fn(), [next(fake_times)] * 3)[1],
    )(softmax._softmax_single_block_forward_kernel)


def _launch(kernel, x):
    y = torch.full_like(x, float("nan"))
    kernel[(ROWS,)](y, y.stride(0), x, x.stride(0), COLS)
    return y


def test_liger_softmax_forward_wrapped_at_run_time():
    kernel = _wrapped()
    assert kernel.name == "liger_kernel.ops.softmax:_softmax_single_block_forward_kernel"
    x = torch.randn(ROWS, COLS)
    y = _launch(kernel, x)
    expected, block, _, multi_block = softmax._softmax_forward(x)  # Liger's own launcher (block 128 for 100 columns)
    assert block == 128 and not multi_block
    torch.testing.assert_close(y, expected)
    assert kernel.stats.benchmarks == 2 and kernel.best_config.kwargs["BLOCK_SIZE"] == 256  # 64 rejected, never timed
    again = _wrapped()  # a new kernel object, as in a second process: served from the store
    assert torch.equal(_launch(again, x), y)
    assert again.stats.benchmarks == 0 and again.stats.stored == 1
