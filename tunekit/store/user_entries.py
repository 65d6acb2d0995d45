"""User kernels' entries (tunekit.autotune) as data: named, checked on import and listed without importing any code.

A user kernel is named by its import path, `package.module:attribute` (tunekit's own kernel names hold no colon).

An imported entry of a user kernel (named `package.module:attribute`) is checked as far as data allows: a
well-formed entry of this schema (tunekit.store.payload), a kernel name that is an import path, a device object that
is the device its key names, a best time within physical bounds. Whether its config is one of the kernel's
candidates can only be known with the kernel's code, so that is checked when the kernel serves it (an entry whose
config is not a candidate is never served: tunekit.user_kernels.decorator).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tunekit.core.device import DeviceFingerprint
from tunekit.core.errors import DatabaseError, TunekitError
from tunekit.core.render import brief, plain
from tunekit.core.space import Value
from tunekit.store.entry import Entry
from tunekit.store.key import CacheKey
from tunekit.store.payload import parse_payload

__all__ = ["check_import_path", "is_user_kernel", "user_problem_text", "validate_user_entry"]


def is_user_kernel(name: str) -> bool:
    """A user kernel is named by its import path; tunekit's own kernel names hold no colon."""
    return ":" in name


_IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*")
_LAUNCH_FLOOR_MS = 1e-3  # as tunekit.store.database: no launch completes in under a microsecond
_MAX_TIME_MS = 1e7


def check_import_path(name: str) -> str:
    if not _IMPORT_PATH.fullmatch(name):
        raise TunekitError(
            f"a user kernel is named by its import path `package.module:attribute`, but got {brief(name)}"
        )
    return name


def validate_user_entry(data: dict[str, Any], where: str) -> Entry:
    """An imported user-kernel entry, checked as data (nothing is imported). Raises DatabaseError naming the rule."""
    key = data.get("key")
    try:
        check_import_path(str(key.get("kernel") if isinstance(key, dict) else ""))
        digest = CacheKey.from_json(key).digest  # type: ignore[arg-type]
    except (TunekitError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise DatabaseError(f"{where}: a malformed user-kernel key ({exc})") from None
    entry, _, why = parse_payload(digest, json.dumps(data))
    if entry is None:
        raise DatabaseError(f"{where}: {why}")
    for what, record in (("device", entry.device), ("provenance", entry.provenance)):
        nested = sorted(k for k, v in record.items() if not (v is None or isinstance(v, (str, bool, int, float))))
        if nested:
            raise DatabaseError(f"{where}: {what} is a flat record of JSON scalars, but {nested} are not scalars")
    try:
        device_key = DeviceFingerprint.from_json(entry.device).key
    except (KeyError, TypeError, ValueError) as exc:
        raise DatabaseError(f"{where}: the device object is malformed ({exc})") from None
    if device_key != entry.key.device_key:
        raise DatabaseError(f"{where}: the device object is not the device key.device_key names")
    for t in (entry.time_ms, *(r.time_ms for r in entry.trials if r.status == "ok")):
        if t is None or not (math.isfinite(t) and _LAUNCH_FLOOR_MS <= t < _MAX_TIME_MS):
            raise DatabaseError(f"{where}: a time must be in [{_LAUNCH_FLOOR_MS:g}, {_MAX_TIME_MS:g}) ms, got {t!r}")
    return entry


def user_problem_text(problem: dict[str, Value]) -> str:
    """A user kernel's problem (or config) as printed text, escaped: its names and values are stored data."""
    return plain(",".join(f"{k}={v}" for k, v in sorted(problem.items())))
