"""Quiet and quick: `--version` and `--help` import neither torch nor triton and print no note about the GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from tunekit.cli import app
try:
    app(sys.argv[1:], prog_name="tunekit")
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "triton", "numpy", "optuna") if m in sys.modules)
print("imported:", ",".join(heavy) or "nothing heavy", file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["tune", "--help"], ["show", "--help"], []])
def test_version_and_help_import_no_torch(args):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, env={"COLUMNS": "80"}
    )
    assert done.stderr.strip().splitlines()[-1] == "imported: nothing heavy", done.stderr
    assert "no CUDA GPU found" not in done.stdout + done.stderr
    assert done.stdout.strip()


def test_cross_entropy_with_ignored_targets_raises_no_interpreter_warning():
    """Ignored rows compute log(0) and 0 * inf in lanes the kernel discards; the interpreter's numpy warnings about
    them are tunekit's doing and reach no user."""
    import warnings

    import torch

    import tunekit

    x = torch.randn(8, 64, requires_grad=True)
    target = torch.randint(0, 64, (8,))
    target[:4] = -100
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loss = tunekit.ops.cross_entropy(x, target)
        loss.backward()
    assert torch.isfinite(loss) and x.grad is not None and bool((x.grad[:4] == 0).all())
