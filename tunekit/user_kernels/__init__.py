"""Users' own Triton kernels, tuned and stored by tunekit: `tunekit.autotune` replaces `@triton.autotune`.

- decorator: `autotune` and `Autotuned` (the launch path: memo -> store -> measure)
- key: a launch's tuning key, and the same key as stored data
- configs: candidates (a config list or a space) and configs as stored data
- launch: one launch with triton.autotune's hooks
- verify: a user kernel as a tunekit KernelSpec (fresh inputs, poisoned outputs, the user's reference)
- search: measuring a config list (triton.autotune's way) or searching a space (tunekit's tuner)
- stored: the store adapter (identity, lookup, stale entries, shipped databases)
- entries: user-kernel entries in databases and the CLI (validation without importing code)
"""

from __future__ import annotations

from tunekit.user_kernels.decorator import Autotuned, Stats, autotune
from tunekit.user_kernels.verify import DEFAULT_TOLERANCES

__all__ = ["DEFAULT_TOLERANCES", "Autotuned", "Stats", "autotune"]
