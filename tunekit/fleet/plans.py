"""Plans: the problems a run is to tune, as JSON lines of {"kernel", "problem"} (written by tunekit.record_problems
and `tunekit record`'s suite plans), checked the way an imported database entry is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunekit.core.errors import InvalidShapeError, TunekitError
from tunekit.core.problems import check_problem
from tunekit.core.render import all_text
from tunekit.core.space import Value
from tunekit.runtime.recorder import plan_line
from tunekit.store.user_entries import is_user_kernel


def _shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        parts: list[Any] = value.lower().replace("*", "x").split("x")
        try:
            parts = [int(p) for p in parts]
        except ValueError:
            parts = []
    else:
        parts = value if isinstance(value, list) else []
    if not parts or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in parts):
        raise InvalidShapeError(f"'shape' must be positive integers, as a list or joined by 'x', but got {value!r}")
    return tuple(parts)


def plan_item(data: Any) -> tuple[str, dict[str, Value]]:
    """(kernel, problem) from one plan item: {"kernel", "problem": {...}} or {"kernel", "shape", "dtype"}."""
    from tunekit.core.registry import get_spec

    if not isinstance(data, dict) or not isinstance(data.get("kernel"), str):
        raise TunekitError('each item must be an object with a "kernel" name')
    if not all_text(data):
        raise TunekitError("a string in it is not valid Unicode text (a lone surrogate such as \\ud800)")
    if is_user_kernel(data["kernel"]):
        return user_plan_item(data)  # checked as data: the kernel is imported only by `tune --plan`
    spec = get_spec(data["kernel"])
    extra = sorted(set(data) - {"kernel", "problem", "shape", "dtype", "serves"})
    if extra:
        raise TunekitError(f'unknown fields {extra}: an item has "kernel" and "problem", or "shape" and "dtype"')
    if not isinstance(data.get("serves", {}), dict):  # a bucket edge's token counts (tunekit.runtime.recorder)
        raise TunekitError('"serves" must be an object: the token counts a bucket edge stands for')
    if "problem" in data:
        if "shape" in data or "dtype" in data:
            raise TunekitError('give "problem", or "shape" and "dtype", not both')
        return spec.name, check_problem(spec, data["problem"])
    if "shape" not in data or not isinstance(data.get("dtype"), str):
        raise TunekitError(f'give "problem", or "shape" ({spec.shape_help or "see tunekit show"}) and a "dtype" string')
    return spec.name, check_problem(spec, spec.problem_from_shape(_shape(data["shape"]), data["dtype"]))


def user_plan_item(data: dict[str, Any]) -> tuple[str, dict[str, Value]]:
    """A user kernel's item: {"kernel": "package.module:attribute", "problem": {key argument: value, ...}}."""
    from tunekit.store.user_entries import check_import_path

    name = check_import_path(data["kernel"])
    problem = data.get("problem")
    if sorted(data) != ["kernel", "problem"] or not isinstance(problem, dict):
        raise TunekitError(
            f'a user kernel\'s item is {{"kernel", "problem": {{...}}}}, but {name}\'s has {sorted(data)}'
        )
    bad = {k: v for k, v in problem.items() if not isinstance(v, (str, bool, int))}
    if bad:
        raise TunekitError(f"{name}: problem values must be strings, bools or ints, but got {bad}")
    return name, dict(problem)


def read_plan(path: Path) -> list[tuple[str, dict[str, Value]]]:
    """A plan file: JSON lines (blank and '#' lines skipped) or one JSON list. Duplicates are dropped."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TunekitError(f"cannot read the plan {path}: {exc}") from None
    items: list[tuple[int, Any]] = []
    if text.lstrip().startswith("["):
        try:
            items = list(enumerate(json.loads(text), 1))
        except ValueError as exc:
            raise TunekitError(f"{path} is not valid JSON: {exc}") from None
        except RecursionError:
            raise TunekitError(f"{path} is not a plan: nested too deeply") from None
        where = "item"
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    items.append((number, json.loads(line)))
                except ValueError as exc:
                    raise TunekitError(f"{path} line {number}: not valid JSON: {exc}") from None
                except RecursionError:
                    raise TunekitError(f"{path} line {number}: not a plan item: nested too deeply") from None
        where = "line"
    plan: dict[str, tuple[str, dict[str, Value]]] = {}
    for number, data in items:
        try:
            kernel, problem = plan_item(data)
        except TunekitError as exc:
            raise type(exc)(f"{path} {where} {number}: {exc}") from None
        plan.setdefault(plan_line(kernel, problem), (kernel, problem))
    if not plan:
        raise TunekitError(f"{path} holds no problems")
    return list(plan.values())
