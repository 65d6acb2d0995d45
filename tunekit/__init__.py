"""tunekit: autotuned Triton kernels with a device-keyed cache.

`import tunekit` is cheap: it imports neither torch nor triton. `tunekit.ops`, `tunekit.nn`, `tunekit.patch` /
`tunekit.unpatch` and `tunekit.record_problems` load on first use. Whatever imports triton first, tunekit.core.backend
runs just before it (the hook below): it picks the GPU or Triton's interpreter, which triton reads when imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

# The one place the version is written: setuptools reads it statically (pyproject.toml, [tool.setuptools.dynamic]).
__version__ = "0.1.0"
# The name on the package index (`tunekit` there is an unrelated project); install hints use it. pyproject.toml's
# `name` must match (tests/test_packaging.py checks).
DISTRIBUTION = "tunekit-triton"


class _BackendBeforeTriton(importlib.abc.MetaPathFinder):
    """Runs tunekit.core.backend (GPU or interpreter: it sets TRITON_INTERPRET) right before triton is first imported,
    then leaves the import to the usual finders and removes itself. No module has to remember the order."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "triton":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            importlib.import_module("tunekit.core.backend")
        return None


if "triton" not in sys.modules and "tunekit.core.backend" not in sys.modules:
    sys.meta_path.insert(0, _BackendBeforeTriton())

if TYPE_CHECKING:
    from tunekit import nn as nn
    from tunekit import ops as ops
    from tunekit.evaluation.tune_model import tune_model as tune_model
    from tunekit.integrations.patching import patch as patch
    from tunekit.integrations.patching import unpatch as unpatch
    from tunekit.runtime.recorder import record_problems as record_problems
    from tunekit.user_kernels import autotune as autotune

# Public names loaded on first access: name -> (module, attribute or None for the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "ops": ("tunekit.ops", None),
    "nn": ("tunekit.nn", None),
    "patch": ("tunekit.integrations.patching", "patch"),
    "unpatch": ("tunekit.integrations.patching", "unpatch"),
    "record_problems": ("tunekit.runtime.recorder", "record_problems"),
    "tune_model": ("tunekit.evaluation.tune_model", "tune_model"),
    "autotune": ("tunekit.user_kernels", "autotune"),
}

__all__ = [
    "DISTRIBUTION", "__version__", "autotune", "nn", "ops", "patch", "record_problems", "tune_model", "unpatch",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'tunekit' has no attribute {name!r}")
    module_name, attribute = target
    module = importlib.import_module(module_name)  # a broken install fails here, loudly
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later accesses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
