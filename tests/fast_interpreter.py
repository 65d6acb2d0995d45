"""Triton's interpreter, made cheaper for the test suite without changing what a kernel computes.

Two of its costs are pure overhead at the tests' sizes (measured on a tiny Llama's conformance check, this 2-core
CPU: 1.45 s as Triton ships it, 0.96 s without the first, 0.68 s without both; ProphetNet 14.1, 9.8, 6.8 s):

- Its int32 overflow sanitizer redoes every int32 add, sub and mul of a kernel in int64. The tests' tensors are far
  too small to overflow an int32 offset; the kernels' int64-offset paths are tested by lowering their limit
  (`INT32_LIMIT`).
- Every call of a jit function, a device function inside a kernel too, scans `triton.language`'s members with
  `inspect.getmembers` to find the builtins it patches. Which of a module's or class's attributes are builtins does not
  change, so the names are found once; the patching itself is Triton's, attribute by attribute, as before (an
  attribute a running kernel already patched is not a builtin, so it is left, as Triton leaves it).

TUNEKIT_TEST_PLAIN_INTERPRETER=1 runs the interpreter as Triton ships it. Written against Triton 3.6's interpreter
(the version constraints.txt pins); with any other the interpreter is left as it is.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import triton
import triton.language as tl

ORIGINAL: dict[str, Any] = {}  # what install() replaced: Triton's own _patch_builtin and interpreter options


def install() -> bool:
    """Apply both changes where this Triton is the one they were written for; whether they were applied."""
    if os.environ.get("TUNEKIT_TEST_PLAIN_INTERPRETER") == "1" or not triton.__version__.startswith("3.6."):
        return False
    from triton.runtime import interpreter

    if not all(hasattr(interpreter, name) for name in ("interpreter_builder", "_patch_builtin", "_patch_attr")):
        return False
    builder = interpreter.interpreter_builder
    ORIGINAL.update(patch_builtin=interpreter._patch_builtin, options=builder.options)
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    builtin_names: dict[int, list[str]] = {}

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        names = builtin_names.get(id(pkg))
        if names is None:
            names = builtin_names[id(pkg)] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin
    return True
