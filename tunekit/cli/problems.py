"""The problems that --kernel, --shape and --dtype name (a kernel's default set when no shape is given)."""

from __future__ import annotations

from tunekit.core.errors import InvalidShapeError
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


def kernel_problems(kernel: str, shapes: list[str] | None, dtype: str | None) -> list[Problem]:
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec

    spec = get_spec(kernel)
    if not shapes:
        problems = spec.default_problems(fingerprint())
        return [dict(p, dtype=dtype) if dtype else dict(p) for p in problems]
    default_dtype = dtype or ("float32" if fingerprint().is_interpreter else "float16")
    return [dict(spec.problem_from_shape(parse_shape(s), default_dtype)) for s in shapes]
