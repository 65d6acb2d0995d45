"""The problems that --kernel, --shape and --dtype name (a kernel's default set when no shape is given)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.errors import InvalidInputError, InvalidShapeError

if TYPE_CHECKING:
    from tunekit.core.space import Problem


def parse_shape(text: str) -> tuple[int, ...]:
    parts = text.lower().replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise InvalidShapeError(f"--shape must be positive integers joined by 'x' (e.g. 4096x1024), but got {text!r}")
    return dims


def check_dtype(dtype: str | None) -> None:
    """Refuse a --dtype no kernel takes before any problem is built from it (a default problem given an unknown
    dtype would fail later, deep in a kernel's code)."""
    from tunekit.core.spec import DTYPES

    if dtype is not None and dtype not in DTYPES:
        raise InvalidInputError(f"--dtype must be one of {', '.join(DTYPES)}, but got {dtype!r}")


def kernel_problems(kernel: str, shapes: list[str] | None, dtype: str | None) -> list[Problem]:
    from tunekit.core.device import fingerprint
    from tunekit.core.problems import check_fits
    from tunekit.core.registry import get_spec

    spec = get_spec(kernel)
    check_dtype(dtype)
    if not shapes:
        problems = spec.default_problems(fingerprint())
        return [dict(p, dtype=dtype) if dtype else dict(p) for p in problems]
    default_dtype = dtype or ("float32" if fingerprint().is_interpreter else "float16")
    problems = [dict(spec.problem_from_shape(parse_shape(s), default_dtype)) for s in shapes]
    for problem in problems:  # refused here, in one line, not by the allocator once tuning has started
        check_fits(spec, problem)
    return problems
