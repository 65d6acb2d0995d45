"""Which stored payloads may be served: JSON text parsed, then checked against the entry schema and the kernel's space.

A payload is data read from disk: it is parsed as JSON, never unpickled, and refused (with a reason) unless it is a
well-formed entry of this schema, stored under its own key's digest, whose problem and best config fit the space of
the kernel's current source.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tunekit.core import registry
from tunekit.core.device import DeviceFingerprint
from tunekit.core.errors import TunekitError
from tunekit.core.problems import problem_error
from tunekit.core.render import all_text
from tunekit.store.entry import TRIAL_STATUSES, Entry
from tunekit.store.floors import time_floor_ms
from tunekit.store.key import SCHEMA_VERSION


def parse_payload(digest: str, raw: object) -> tuple[Entry | None, str, str]:
    """(entry, "", "") or (None, reason, why)."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return None, "corrupted", "not a JSON object (a corrupted or truncated payload)"
    key = data.get("key")
    schema = key.get("schema") if isinstance(key, dict) else None
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
        why = f"written by a newer tunekit (schema {schema}; this one reads {SCHEMA_VERSION}): upgrade tunekit"
        return None, "newer-schema", why
    problem = _structure_problem(data) if all_text(data) else "a string in it is not valid Unicode text"
    if problem is not None:
        return None, "malformed", problem
    entry = Entry.from_json(data)
    if entry.key.digest != digest:
        return None, "foreign", "it is stored under another key's digest"
    problem = _space_problem(entry)
    if problem is not None:
        return None, "outside-space", problem
    return entry, "", ""


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, bool)) or (isinstance(value, int) and abs(value) < 2**53)


def _structure_problem(data: dict[str, Any]) -> str | None:
    """Why this payload is not a well-formed entry of this schema, or None. Needs no kernel spec."""
    key, best, trials = data.get("key"), data.get("best"), data.get("trials", [])
    if not isinstance(key, dict) or key.get("schema") != SCHEMA_VERSION or isinstance(key.get("schema"), bool):
        return f"its key is missing or not of schema {SCHEMA_VERSION}"
    if not all(isinstance(key.get(f), str) for f in ("kernel", "source_hash", "device_key")):
        return "its key's kernel, source_hash and device_key must be strings"
    problem = key.get("problem")
    if not isinstance(problem, dict) or not all(_is_scalar(v) for v in problem.values()):
        return "its key's problem must map names to strings, bools or ints"
    if not isinstance(best, dict) or not _is_config(best.get("config")):
        return "its best config must map names to strings, bools or ints"
    t = best.get("time_ms")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        return f"its best time must be a finite number > 0, but is {t!r}"
    if not isinstance(data.get("device"), dict) or not isinstance(data.get("provenance"), dict):
        return "its device and provenance must be objects"
    if not isinstance(trials, list):
        return "its trials must be a list"
    for trial in trials:
        if not isinstance(trial, dict) or trial.get("status") not in TRIAL_STATUSES:
            return "a trial is not {config, status, time_ms, error}"
        if not _is_config(trial.get("config")):
            return "a trial is not {config, status, time_ms, error}"
        tt = trial.get("time_ms")
        if tt is not None and (isinstance(tt, bool) or not isinstance(tt, (int, float))):
            return "a trial's time_ms must be a number or null"
    return None


def _is_config(config: Any) -> bool:
    return isinstance(config, dict) and all(isinstance(k, str) and _is_scalar(v) for k, v in config.items())


def _space_problem(entry: Entry) -> str | None:
    """For an entry of the kernel's current source: its problem fields and best config must fit the spec.

    Only checked when the kernel's spec is already loaded (the store never imports kernels by itself); entries of
    another source may legitimately predate today's space and are served by nobody anyway.
    """
    spec = registry._loaded.get(entry.key.kernel)
    if spec is None or entry.key.source_hash != spec.source_hash:
        return None
    error = problem_error(spec, dict(entry.key.problem))
    if error is not None:
        return f"its problem is not one the kernel declares ({error})"
    try:
        spec.space.check_membership(entry.config)
    except TunekitError as exc:
        return f"its best config is outside the {spec.name} space ({exc})"
    try:
        device: DeviceFingerprint | None = DeviceFingerprint.from_json(dict(entry.device))
    except (KeyError, TypeError, ValueError):
        device = None  # the floor of any GPU
    floor = time_floor_ms(spec, dict(entry.key.problem), device)
    if entry.time_ms < floor:
        return f"its best time {entry.time_ms:.3g} ms is below the problem's physical floor ({floor:.3g} ms)"
    return None
