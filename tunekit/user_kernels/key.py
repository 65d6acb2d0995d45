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
_NO_DTYPE = frozenset({int, float, bool, str, type(None)})  # the common launch arguments that never carry one


def _has_dtype(value: Any) -> bool:
    return type(value) not in _NO_DTYPE and hasattr(value, "dtype")


@dataclass(frozen=True)
class KeyMaker:
    kernel: str
    arg_names: tuple[str, ...]
    keys: tuple[str, ...]
    key_positions: tuple[int, ...] = ()  # each key argument's position among the arguments
    arg_set: frozenset[str] = frozenset()

    @classmethod
    def make(cls, kernel: str, arg_names: Sequence[str], keys: Sequence[str]) -> KeyMaker:
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise TunekitError(f"{kernel}: key= must be a list of argument names, but got {keys!r}")
        unknown = [k for k in keys if k not in arg_names]
        if unknown:
            raise TunekitError(
                f"{kernel}: key names {unknown}, which are not arguments; its arguments: {list(arg_names)}"
            )
        positions = tuple(list(arg_names).index(k) for k in keys)
        return cls(kernel, tuple(arg_names), tuple(keys), positions, frozenset(arg_names))

    def memo_key(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """The in-process key of a launch (what triton.autotune keys its cache on: the key arguments' values, each
        tensor argument's dtype), read from the call's own arguments: it runs on every launch, so no dict of the
        arguments is built and a dtype stays an object. Raises one line if a key argument is missing."""
        values = []
        for name, position in zip(self.keys, self.key_positions):
            if position < len(args):
                values.append(args[position])
            elif name in kwargs:
                values.append(kwargs[name])
            else:
                raise InvalidInputError(
                    f"{self.kernel}: key argument {name!r} was not passed (key={list(self.keys)}); pass it "
                    "positionally or by name"
                )
        plain = _NO_DTYPE  # inlined, not _has_dtype: a call per argument is most of this function's time
        values += [v.dtype for v in args if type(v) not in plain and hasattr(v, "dtype")]
        if kwargs:
            values += [(k, v.dtype) for k, v in kwargs.items() if k in self.arg_set and _has_dtype(v)]
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
