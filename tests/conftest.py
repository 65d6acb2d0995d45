from __future__ import annotations

import pytest

import tunekit.core.backend  # noqa: F401  (selects the interpreter before any kernel module is imported)
from tunekit.core import registry
from tunekit.runtime.dispatch import reset_all


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache store and fresh dispatch memos; nothing leaks between tests."""
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("TUNEKIT_STRICT", "TUNEKIT_TUNE_ON_MISS"):
        monkeypatch.delenv(var, raising=False)
    reset_all()
    yield tmp_path / "cache"
    reset_all()


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

    monkeypatch.setattr(compile_policy, "FORCED", frozenset(compile_policy.OPS))
