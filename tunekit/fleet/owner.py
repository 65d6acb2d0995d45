"""Who holds a claimed fleet job: a record of the claiming process that any process on the same machine can check.

A journal storage has no heartbeats, so nothing finds a job of a SIGKILLed worker stale. Each claim therefore
records its owner: host name, boot id, pid, the process's start time (clock ticks since boot, Linux) and the trial
it claimed. On the same host and boot, the owner is gone when no process has that pid, when the process is a zombie,
or when the pid now belongs to a process that started at another time (pid reuse). Anywhere else, or for a record
inherited from an earlier attempt of the job (another trial), nothing can be told: None.
Caveat: two containers with the same host name sharing one kernel (one boot id) but not their pid namespaces would
each take the other's live workers for gone; re-queueing then only repeats work (the original can never complete).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

__all__ = ["describe_owner", "owner_alive", "owner_record"]


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot; Linux), or None; -1 for a zombie (it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return -1 if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_record(trial_id: int) -> dict[str, Any]:
    """This process as the owner of a claimed trial: enough to tell later, on this machine, that it is gone."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": pid,
        "start": _start_ticks(pid),
        "trial": trial_id,
    }


def owner_alive(owner: Any, trial_id: int) -> bool | None:
    """Whether a trial's recorded owner process still runs: True or False where this machine can tell, else None
    (another machine, no record, or a record copied from an earlier attempt of the job)."""
    if not isinstance(owner, dict) or owner.get("trial") != trial_id:
        return None
    if owner.get("host") != socket.gethostname() or owner.get("boot") != _boot_id():
        return None
    pid = owner.get("pid")
    if type(pid) is not int or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return None
    start = _start_ticks(pid)
    if start == -1:
        return False  # exited, not yet reaped by its parent
    recorded = owner.get("start")
    # A different start time: the pid now belongs to a newer process.
    return start is None or type(recorded) is not int or start == recorded


def describe_owner(owner: Any) -> str:
    if not isinstance(owner, dict):
        return "an unknown worker"
    return f"{owner.get('host')}:{owner.get('pid')}"
