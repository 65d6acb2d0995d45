"""Whether a problem is one its kernel declares. Every problem that enters tunekit from outside is checked here:
plan files (read and written), `tunekit plan` and `tune --plan`, imported databases and store rows.

A problem has exactly the spec's `problem_fields`; each value has the type the spec's own default problems give
that field (an int is never a bool, a float never an int), and lies in what the spec declares for it
(`KernelSpec.problem_values`), or else: dtype one of the kernel's dtypes (its `tolerances`), an int a size in
[1, 2^40), a string at most 64 characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tunekit.core import backend
from tunekit.core.errors import TunekitError
from tunekit.core.render import brief, byte_size
from tunekit.core.space import Value
from tunekit.core.spec import KernelSpec

__all__ = ["MAX_SIZE", "check_fits", "field_types", "fit_error", "problem_error"]

MAX_SIZE = 2**40  # no tensor dimension tunekit tunes comes near this (2^40 elements is 4 TiB of float32)
_MAX_TEXT = 64
_TYPE_NAMES = {int: "an int", str: "a string", bool: "a bool"}
_FIELD_TYPES: dict[str, dict[str, type]] = {}


def field_types(spec: KernelSpec) -> dict[str, type]:
    """The type of each problem field, as the spec's own default problems use it (where they all agree)."""
    types = _FIELD_TYPES.get(spec.name)
    if types is None:
        from tunekit.core.device import fingerprint

        seen: dict[str, set[type]] = {}
        for problem in spec.default_problems(fingerprint()):
            for name, value in problem.items():
                seen.setdefault(name, set()).add(type(value))
        types = _FIELD_TYPES[spec.name] = {n: next(iter(t)) for n, t in seen.items() if len(t) == 1}
    return types


def _allowed(values: tuple[Any, ...] | range) -> str:
    if isinstance(values, range):
        return f"an int in [{values.start}, {values.stop if values.stop != MAX_SIZE else '2^40'})"
    return f"one of {list(values)}"


def problem_error(spec: KernelSpec, problem: Any, where: str = "") -> str | None:
    """Why `problem` is not a problem of `spec` (one line naming the field, as `where`.field if given, the rule and
    the value), or None."""
    if not isinstance(problem, dict) or sorted(problem) != sorted(spec.problem_fields):
        got = brief(sorted(map(str, problem)) if isinstance(problem, dict) else type(problem).__name__)
        whole = f"{where} must have" if where else f"a {spec.name} problem has"
        return f"{whole} exactly the fields {sorted(spec.problem_fields)}, but got {got}"
    label = (lambda name: f"{where}.{name}") if where else (lambda name: f"{spec.name} problem field {name!r}")
    types = field_types(spec)
    for name in spec.problem_fields:
        value = problem[name]
        want = types.get(name)
        if type(value) not in _TYPE_NAMES or (want is not None and type(value) is not want):
            kind = _TYPE_NAMES.get(want, "a string, bool or int") if want else "a string, bool or int"
            return f"{label(name)} must be {kind}, but got {brief(value)}"
        declared = spec.problem_values.get(name)
        if declared is None and name == "dtype":
            declared = tuple(spec.tolerances)
        if declared is None and type(value) is int:
            declared = range(1, MAX_SIZE)
        if declared is not None and value not in declared:
            return f"{label(name)} must be {_allowed(declared)}, but got {brief(value)}"
        if type(value) is str and (len(value) > _MAX_TEXT or not value.isprintable()):
            return f"{label(name)} must be printable text of at most {_MAX_TEXT} characters, but got {brief(value)}"
    return None


def check_problem(spec: KernelSpec, problem: Any) -> dict[str, Value]:
    """A problem of `spec`, as its declaration allows (tunekit.core.problems); else a one-line TunekitError."""
    error = problem_error(spec, problem)
    if error is not None:
        raise TunekitError(error)
    return dict(problem)


def fit_error(spec: KernelSpec, problem: Mapping[str, Value], memory: int | None = None) -> str | None:
    """Why a (declared) problem cannot be tuned on this machine, or None: its tensors (what it reads and writes,
    the spec's bytes_moved, a lower bound of what the tuner allocates) exceed the memory they would live in
    (tunekit.core.device.memory_bytes unless `memory` is given: the GPU's, or the host's in the interpreter)."""
    from tunekit.core.device import memory_bytes

    available = memory_bytes() if memory is None else memory
    needed = spec.bytes_moved(dict(problem))
    if needed <= available:
        return None
    where = "the host's memory (kernels run in the interpreter)" if backend.INTERPRETED else "the GPU's memory"
    return (
        f"{spec.name} {spec.describe_problem(problem)} cannot fit: its tensors take {byte_size(needed)}, more than "
        f"the {byte_size(available)} of {where}"
    )


def check_fits(spec: KernelSpec, problem: Mapping[str, Value]) -> None:
    """fit_error as a one-line TunekitError."""
    error = fit_error(spec, problem)
    if error is not None:
        raise TunekitError(error)


def checked_items(plan: Iterable[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, dict[str, Value]]]:
    """Each (kernel, problem) of a plan about to be written, checked by its kernel's declaration."""
    from tunekit.core.registry import get_spec  # the registry imports the kernels, which import this module

    return [(kernel, check_problem(get_spec(kernel), dict(problem))) for kernel, problem in plan]
