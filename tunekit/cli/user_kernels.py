"""User kernels (`tunekit.autotune`) in the CLI: their entries in `tunekit show`, and their problems in `tune --plan`.

`show` lists their entries as data: it never imports a user kernel. Only `tune --plan` imports one, because the plan
names it explicitly by import path (`package.module:attribute`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunekit.cli.app import say
from tunekit.core.render import plain
from tunekit.user_kernels.by_path import load_kernel

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


def tune_user_plan(items: list[tuple[str, dict[str, Any]]], force: bool, queued: bool) -> int:
    """Tune the plan's user-kernel problems (each kernel's `inputs=` builds a launch of the problem); one line each.
    With --submit or --workers nothing is tuned here: the fleet's workers take them."""
    from tunekit.store.user_entries import user_problem_text

    if queued:
        return 0  # with --submit or --workers they are jobs like the plan's other problems (tunekit.cli.fleet)
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
