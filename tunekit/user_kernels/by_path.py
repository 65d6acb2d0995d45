"""A user kernel loaded by the import path a plan or a fleet job names (`package.module:attribute`): the one place
tunekit imports a user's code, for `tunekit tune --plan` here and for the fleet workers that take its jobs."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from tunekit.core.errors import TunekitError

if TYPE_CHECKING:
    from tunekit.user_kernels.decorator import Autotuned


def load_kernel(name: str) -> Autotuned:
    """The tunekit.autotune kernel at import path `name`: imported because a plan under `tune --plan` (or a job)
    names it (from the current directory, as `python -m` would, or from what is installed)."""
    from tunekit.store.user_entries import check_import_path
    from tunekit.user_kernels.decorator import Autotuned

    module_name, _, attribute = check_import_path(name).partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` finds modules: the current directory, then what is installed
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise TunekitError(f"cannot load the user kernel {name}: {exc}") from None
    if not isinstance(obj, Autotuned):
        raise TunekitError(f"{name} is a {type(obj).__name__}, not a kernel decorated with tunekit.autotune")
    return obj
