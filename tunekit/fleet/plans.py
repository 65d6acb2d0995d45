"""Plans: the problems a run is to tune, as JSON lines of {"kernel", "problem"} (written by tunekit.record_problems
and `tunekit record`'s suite plans), checked the way an imported database entry is."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunekit.core.errors import InvalidShapeError, TunekitError
from tunekit.core.problems import check_fits, check_problem
from tunekit.core.render import all_text
from tunekit.core.space import Value
from tunekit.runtime.recorder import plan_line
from tunekit.store.bounded_file import UnreadableFileError, nesting_error, read_text
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
    """(kernel, problem) from one plan item: {"kernel", "problem": {...}} or {"kernel", "shape", "dtype"}, a
    problem of its kernel's declaration whose tensors fit in this machine's memory."""
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
        problem = check_problem(spec, data["problem"])
    elif "shape" not in data or not isinstance(data.get("dtype"), str):
        raise TunekitError(f'give "problem", or "shape" ({spec.shape_help or "see tunekit show"}) and a "dtype" string')
    else:
        problem = check_problem(spec, spec.problem_from_shape(_shape(data["shape"]), data["dtype"]))
    check_fits(spec, problem)
    return spec.name, problem


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


MAX_PLAN_BYTES = 64 << 20  # a model's recorded plan is a few hundred lines of ~200 bytes


@dataclass(frozen=True)
class PlanLine:
    """One problem of a plan, with where it was read: `where` names the file and line (or list item)."""

    where: str
    number: int
    kernel: str
    problem: dict[str, Value]


@dataclass
class PlanLines:
    """A plan as read: its problems (duplicates dropped) and, for each line refused, one line saying why
    ("PATH line N: why"). A bad line never abandons the others."""

    problems: list[PlanLine] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def pairs(self) -> list[tuple[str, dict[str, Value]]]:
        return [(line.kernel, line.problem) for line in self.problems]

    def user_items(self) -> list[tuple[str, dict[str, Value]]]:
        """The (kernel, problem) pairs of user kernels (tunekit.autotune, named by import path)."""
        return [pair for pair in self.pairs() if is_user_kernel(pair[0])]


def _parsed(path: Path, text: str) -> tuple[str, list[tuple[int, Any]], list[tuple[int, str]]]:
    """(what an item is called, (number, JSON) of each item, (number, why) of each line refused) of a plan's text:
    JSON lines, each parsed on its own (blank and '#' lines skipped), or one JSON list."""
    if text.lstrip().startswith("["):
        why = nesting_error(text)
        if why is not None:
            raise TunekitError(f"{path} is not a plan: {why}")
        try:
            return "item", list(enumerate(json.loads(text), 1)), []
        except ValueError as exc:
            raise TunekitError(f"{path} is not valid JSON: {exc}") from None
    items, refused = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        why = nesting_error(line)
        if why is not None:
            refused.append((number, f"{path} line {number}: not a plan item: {why}"))
            continue
        try:
            items.append((number, json.loads(line)))
        except ValueError as exc:
            refused.append((number, f"{path} line {number}: not valid JSON: {exc}"))
    return "line", items, refused


def read_plan_lines(path: Path) -> PlanLines:
    """A plan file (through tunekit.store.bounded_file: a regular file of at most MAX_PLAN_BYTES): each line
    checked on its own (its kernel's declaration, and whether its tensors fit in this machine's memory). A file
    that cannot be read at all raises TunekitError; a bad line is refused, the others kept."""
    try:
        text = read_text(path, "the plan", MAX_PLAN_BYTES)
    except UnreadableFileError as exc:
        raise TunekitError(str(exc)) from None
    where, items, refused = _parsed(path, text)
    plan = PlanLines()
    seen: set[str] = set()
    for number, data in items:
        try:
            kernel, problem = plan_item(data)
        except TunekitError as exc:
            refused.append((number, f"{path} {where} {number}: {exc}"))
            continue
        line = plan_line(kernel, problem)
        if line not in seen:
            seen.add(line)
            plan.problems.append(PlanLine(f"{path} {where} {number}", number, kernel, problem))
    plan.refused = [why for _, why in sorted(refused)]
    if not plan.problems and not plan.refused:
        raise TunekitError(f"{path} holds no problems")
    return plan


def read_plan(path: Path) -> list[tuple[str, dict[str, Value]]]:
    """A plan file's problems, refused whole at its first bad line (what a queue submits: all of it, or nothing).
    Duplicates are dropped."""
    plan = read_plan_lines(path)
    if plan.refused:
        raise TunekitError(plan.refused[0])
    return plan.pairs()
