"""The tuning key of a launch: the key arguments' values and the dtype of every tensor argument, as
`triton.autotune` keys its cache; also as a problem (a flat dict of strings, bools and ints) for the store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import triton.language as tl

from tunekit.core.errors import InvalidInputError, TunekitError
from tunekit.core.space import Value

DTYPE_PREFIX = "dtype."  # a problem field naming the dtype of a tensor argument


@dataclass(frozen=True)
class KeyMaker:
    kernel: str
    arg_names: tuple[str, ...]
    keys: tuple[str, ...]

    @classmethod
    def make(cls, kernel: str, arg_names: Sequence[str], keys: Sequence[str]) -> KeyMaker:
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise TunekitError(f"{kernel}: key= must be a list of argument names, but got {keys!r}")
        unknown = [k for k in keys if k not in arg_names]
        if unknown:
            raise TunekitError(
                f"{kernel}: key names {unknown}, which are not arguments; its arguments: {list(arg_names)}"
            )
        return cls(kernel, tuple(arg_names), tuple(keys))

    def memo_key(self, named: Mapping[str, Any]) -> tuple[Any, ...]:
        """The in-process key (what triton.autotune keys its cache on). Raises one line if a key argument is missing."""
        try:
            values = [named[k] for k in self.keys]
        except KeyError as exc:
            raise InvalidInputError(
                f"{self.kernel}: key argument {exc.args[0]!r} was not passed (key={list(self.keys)}); pass it "
                "positionally or by name"
            ) from None
        values += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]  # `named` holds only arguments
        return tuple(values)

    def problem(self, named: Mapping[str, Any]) -> dict[str, Value]:
        """The key as stored data: {key argument: value, "dtype.<argument>": dtype name}."""
        problem: dict[str, Value] = {k: self._value(k, named[k]) for k in self.keys}
        for name, value in named.items():
            if hasattr(value, "dtype"):
                problem[DTYPE_PREFIX + name] = str(value.dtype).removeprefix("torch.")
        return problem

    def _value(self, name: str, value: Any) -> Value:
        if isinstance(value, (bool, str)) or (isinstance(value, int) and abs(value) < 2**53):
            return value
        if isinstance(value, float) or value is None:
            return repr(value)
        if isinstance(value, tl.dtype):  # a constexpr dtype argument (`DTYPE=tl.float32`)
            return str(value)
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            raise InvalidInputError(
                f"{self.kernel}: key argument {name!r} is a tensor; key on a size argument instead (a tensor's value "
                "is not a tuning key)"
            )
        raise InvalidInputError(
            f"{self.kernel}: key argument {name!r} must be an int, bool, str, float, None or a tl.dtype, but got "
            f"{type(value).__name__}"
        )
