"""`tunekit.autotune` on the CPU whatever was imported first: with torch and triton imported before tunekit,
on a machine without a GPU and without TRITON_INTERPRET, Triton's own jit functions (tl.max, tl.sum, ...) were built
for the GPU and every config failed in the interpreter. Each case runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_KERNEL = """
@triton.jit
def row_max(x):
    return x.max(axis=0)  # a tensor method reaching Triton's tl.max


@triton.jit
def softmax_kernel(y_ptr, x_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - row_max(x))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=offs < n_cols)
"""

_TUNE = """
softmax_kernel = tunekit.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128) for w in (1, 2)],
    key=["n_cols"],
)(softmax_kernel)
"""

_RUN = """
x = torch.randn(3, 50)
y = torch.empty_like(x)
softmax_kernel[(3,)](y, x, x.stride(0), 50)
assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6), (y, torch.softmax(x, -1))
assert torch.allclose(tunekit.ops.softmax(x, -1), torch.softmax(x, -1), atol=1e-6)  # tunekit's own kernels too
print("ok", softmax_kernel.stats.measured)
"""

_TRITON = "import torch, triton\nimport triton.language as tl\n"
_SCRIPTS = {
    "tunekit first": "import tunekit\n" + _TRITON + _KERNEL + _TUNE,
    "triton first": _TRITON + "import tunekit\n" + _KERNEL + _TUNE,
    "kernel written before tunekit is imported": _TRITON + _KERNEL + "import tunekit\n" + _TUNE,
}


def _run(tmp_path: Path, script_text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "order.py"
    script.write_text(textwrap.dedent(script_text + _RUN))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TUNEKIT_CACHE_DIR"] = str(tmp_path / "cache")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path even where a GPU is present
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", sorted(_SCRIPTS))
def test_the_readme_conversion_runs_on_the_cpu_whatever_was_imported_first(tmp_path, order):
    done = _run(tmp_path, _SCRIPTS[order])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "1"]
    assert "never served" not in done.stderr, done.stderr[-3000:]
