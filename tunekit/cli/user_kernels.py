"""User kernels (`tunekit.autotune`) in the CLI: their entries in `tunekit show`, and their problems in `tune --plan`.

`show` lists their entries as data: it never imports a user kernel. Only `tune --plan` imports one, because the plan
names it explicitly by import path (`package.module:attribute`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tunekit.cli.app import error_line, say
from tunekit.core.errors import TunekitError
from tunekit.core.render import brief, plain
from tunekit.user_kernels.by_path import load_kernel

if TYPE_CHECKING:  # torch: imported by the functions that need it, not when the CLI starts (`--help`, `--version`)
    from tunekit.core.device import DeviceFingerprint
    from tunekit.fleet.plans import PlanLine
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


def tune_user_plan(lines: Sequence[PlanLine], force: bool, queued: bool) -> int:
    """Tune the plan's user-kernel problems (each kernel's `inputs=` builds a launch of the problem); one line each.
    A line whose kernel cannot be loaded, whose problem is not its kernel's key, or whose tuning raises (the
    user's inputs() included) is one `error:` line naming the plan line; the others still run. Returns how many
    failed. With --submit or --workers nothing is tuned here: the fleet's workers take them."""
    from tunekit.store.user_entries import is_user_kernel, user_problem_text

    if queued:
        return 0  # with --submit or --workers they are jobs like the plan's other problems (tunekit.cli.fleet)
    items = [line for line in lines if is_user_kernel(line.kernel)]
    failed = 0
    for line in items:
        name, problem = line.kernel, line.problem
        try:
            entry, measured = _tune_user(load_kernel(name), problem, force)
        except TunekitError as exc:
            error_line(f"{line.where}: {name}: {exc}")
            failed += 1
            continue
        what = f"measured {measured} configs" if measured else "already tuned"
        say(f"{name} {user_problem_text(problem)}: {user_problem_text(entry.config)} {entry.time_ms:.4f} ms ({what})")
    return failed


def _tune_user(kernel: Any, problem: dict[str, Any], force: bool) -> tuple[Entry, int]:
    """`kernel.tune(problem)` once the problem is checked against the kernel's key. Whatever the user's code raises
    on it (its inputs() given a bool, a size it cannot allocate) is one TunekitError line: the plan line is data."""
    problem_error = user_problem_error(kernel, problem)
    if problem_error is not None:
        raise TunekitError(problem_error)
    try:
        return kernel.tune(problem, force=force)
    except TunekitError:
        raise
    except Exception as exc:  # the user's code on a plan's problem: reported, the plan goes on
        first = (str(exc).strip().splitlines() or [""])[0]
        raise TunekitError(
            f"tuning it raised {type(exc).__name__}: {first if len(first) <= 200 else first[:197] + '...'} (its "
            "inputs= builds a launch of the plan's problem: is the problem one the kernel takes?)"
        ) from None


def user_problem_error(kernel: Any, problem: dict[str, Any]) -> str | None:
    """Why `problem` is not a key of `kernel` (a tunekit.autotune kernel), or None: it holds each key argument and
    `dtype.<argument>` for tensor arguments only, each naming a torch dtype."""
    import torch

    from tunekit.user_kernels.key import DTYPE_PREFIX

    keys = list(kernel.key_maker.keys)
    arguments = list(kernel.arg_names)
    dtypes = {k: v for k, v in problem.items() if k.startswith(DTYPE_PREFIX)}
    unknown = sorted(k for k in problem if k not in keys and k.removeprefix(DTYPE_PREFIX) not in arguments)
    unknown += sorted(k for k in dtypes if k.removeprefix(DTYPE_PREFIX) in keys)
    missing = [k for k in keys if k not in problem]
    if unknown:
        return (
            f"unknown problem fields {brief(unknown)}: a problem holds the key arguments {keys} and "
            f"{DTYPE_PREFIX}<argument> for its tensor arguments (of {arguments})"
        )
    if missing:
        return f"the problem misses the key arguments {missing} (its key: {keys})"
    for field, value in sorted(dtypes.items()):
        if not isinstance(value, str) or not isinstance(getattr(torch, value, None), torch.dtype):
            return f"{field} must name a torch dtype (such as float16, bfloat16, float32), but got {brief(value)}"
    return None
