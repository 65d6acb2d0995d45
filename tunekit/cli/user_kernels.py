"""User kernels (`tunekit.autotune`) in the CLI: their entries in `tunekit show`, and their problems in `tune --plan`.

`show` lists their entries as data: it never imports a user kernel. Only `tune --plan` imports one, because the plan
names it explicitly by import path (`package.module:attribute`).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunekit.cli.app import say
from tunekit.core.errors import TunekitError
from tunekit.core.render import plain

if TYPE_CHECKING:  # torch: imported by the functions that need it, not when the CLI starts (`--help`, `--version`)
    from tunekit.core.device import DeviceFingerprint
    from tunekit.store.entry import Entry
    from tunekit.store.store import Store


def user_entries(store: Store, kernel: str | None) -> list[Entry]:
    from tunekit.store.user_entries import is_user_kernel

    return sorted(
        (e for e in store.entries() if is_user_kernel(e.key.kernel) and kernel in (None, e.key.kernel)),
        key=lambda e: (e.key.kernel, str(e.key.problem), e.key.digest),
    )


def show_user_entries(entries: list[Entry], device: DeviceFingerprint) -> None:
    """Each entry in three lines, then a count. Whether its code is current is known only where it is launched."""
    from tunekit.store.user_entries import user_problem_text

    for e in entries:
        here = "this device" if e.key.device_key == device.key else f"device {e.key.device_key[:8]}"
        say(f"{plain(e.key.kernel)} {user_problem_text(dict(e.key.problem))}")
        say(f"  cache · {plain(e.device.get('name', '?'))} ({here}) · {e.time_ms:.4f} ms · {len(e.trials)} trials")
        say(f"  config {user_problem_text(e.config)} · identity {e.key.source_hash}")
    if entries:
        say(f"{len(entries)} user-kernel entr{'y' if len(entries) == 1 else 'ies'} (tunekit.autotune)")


def user_entries_json(entries: list[Entry]) -> list[dict[str, Any]]:
    return [e.to_json() for e in entries]


def load_kernel(name: str) -> Any:
    """The tunekit.autotune kernel at import path `name`: imported because a plan under `tune --plan` names it
    (from the current directory, as `python -m` would, or from what is installed)."""
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


def tune_user_plan(items: list[tuple[str, dict[str, Any]]], force: bool, queued: bool) -> int:
    """Tune the plan's user-kernel problems (each kernel's `inputs=` builds a launch of the problem); one line each.
    Fleet workers do not take them (yet): with --submit or --workers, a plan naming one is refused."""
    from tunekit.store.user_entries import user_problem_text

    if items and queued:
        raise TunekitError(
            f"fleet workers do not tune user kernels yet ({items[0][0]}): tune them here, without --submit/--workers"
        )
    for name, problem in items:
        kernel = load_kernel(name)
        entry, measured = kernel.tune(problem, force=force)
        what = f"measured {measured} configs" if measured else "already tuned"
        say(f"{name} {user_problem_text(problem)}: {user_problem_text(entry.config)} {entry.time_ms:.4f} ms ({what})")
    return len(items)


def plan_user_items(plan: Path) -> list[tuple[str, dict[str, Any]]]:
    from tunekit.fleet.plans import read_plan
    from tunekit.store.user_entries import is_user_kernel

    return [(k, p) for k, p in read_plan(plan) if is_user_kernel(k)]
