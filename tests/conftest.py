from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import settings

import tunekit.core.backend  # noqa: F401  (selects the interpreter before any kernel module is imported)
from tunekit.core import registry
from tunekit.runtime.dispatch import reset_all

# Fuzz tests draw the same examples on every run (a seed per test), so a red run is reproducible and a submission is
# not refused for an example no one has seen; HYPOTHESIS_PROFILE=explore draws new ones (run it to hunt for bugs).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def _fast_interpreter() -> bool:
    import fast_interpreter  # (tests/fast_interpreter.py: what it changes and why), after the backend is chosen

    return fast_interpreter.install()


FAST_INTERPRETER = _fast_interpreter()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core (the test command's -n auto): torch's own intra-op threads would oversubscribe them.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache store and fresh dispatch memos; nothing leaks between tests."""
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("TUNEKIT_STRICT", "TUNEKIT_TUNE_ON_MISS"):
        monkeypatch.delenv(var, raising=False)
    reset_all()
    yield tmp_path / "cache"
    reset_all()


@pytest.fixture(autouse=True)
def terminal_width_of_this_test():
    """rich fixes a console's width when the console is built with COLUMNS set, so the width of whichever test first
    imported the CLI in this process would hold for all (a worker of the parallel run imports it in another test than
    a plain run does): each test's COLUMNS holds instead."""
    consoles = sys.modules.get("tunekit.cli.consoles")
    if consoles is not None:
        for console in (consoles.console, consoles.err_console):
            console.width = None  # type: ignore[assignment]  (rich's setter; None: measured at each print)


@pytest.fixture
def toy(monkeypatch):
    """Register the toy kernel (tests/toy_kernel.py) for the length of one test."""
    monkeypatch.setitem(registry.KERNELS, "toy", "toy_kernel")
    return registry.get_spec("toy")


@pytest.fixture
def swapped_under_compile(monkeypatch):
    """Every op traces as tunekit's own custom op under torch.compile, whatever the compile policy swaps: for the
    tests of that path (the custom ops, their fakes and autograd formulas)."""
    from tunekit.runtime import compile_policy

    monkeypatch.setattr(compile_policy, "FORCED", frozenset({compile_policy.ALL}))


@pytest.fixture
def wide_terminal(monkeypatch):
    """Rich tables at 250 columns: at 80 they would wrap cells. A module that reads tables applies it to every test
    with `pytestmark = pytest.mark.usefixtures("wide_terminal")`."""
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def narrow_terminal(monkeypatch):
    """An 80-column terminal: what the CLI must print in full, wrapped, never cut."""
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture
def untuned_gpu(monkeypatch, tmp_path):
    """Dispatch as on a GPU with no tuned entry here (an empty store, a device no shipped database covers)."""
    import dataclasses

    from fingerprints import H200

    from tunekit.runtime import dispatch

    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dispatch, "fingerprint", lambda: dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3"))
    dispatch.reset_all()
    yield dispatch
    dispatch.reset_all()
