"""Users' own Triton kernels, tuned and stored by tunekit: `tunekit.autotune` replaces `@triton.autotune`.

- decorator: `autotune` and `Autotuned` (the launch path: memo -> store -> measure)
- key: a launch's tuning key, and the same key as stored data
- configs: candidates (a config list or a space) and configs as stored data
- launch: one launch with triton.autotune's hooks
- verify: a user kernel as a tunekit KernelSpec (fresh inputs, poisoned outputs, the user's reference)
- search: measuring a config list (triton.autotune's way) or searching a space (tunekit's tuner)
- stored: the store adapter (identity, lookup, stale entries, shipped databases)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunekit.user_kernels.decorator import Autotuned as Autotuned
    from tunekit.user_kernels.decorator import Stats as Stats
    from tunekit.user_kernels.decorator import autotune as autotune
    from tunekit.user_kernels.verify import DEFAULT_TOLERANCES as DEFAULT_TOLERANCES

# Loaded on first use. Their entries as data (names, checks on import) are tunekit.store.user_entries'.
_LAZY = {
    "autotune": "tunekit.user_kernels.decorator",
    "Autotuned": "tunekit.user_kernels.decorator",
    "Stats": "tunekit.user_kernels.decorator",
    "DEFAULT_TOLERANCES": "tunekit.user_kernels.verify",
}
__all__ = ["DEFAULT_TOLERANCES", "Autotuned", "Stats", "autotune"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunekit.user_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
