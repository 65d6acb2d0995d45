"""Search spaces as data: typed parameters, and constraints as pure predicates.

A space never holds state. Enumeration, the tuner, `explain` and the tests all ask the same predicates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunekit.core.errors import InvalidConfigError

if TYPE_CHECKING:
    import optuna

    from tunekit.core.device import DeviceFingerprint

Value = int | str | bool
Config = Mapping[str, Value]
Problem = Mapping[str, Value]
Predicate = Callable[[Config, Problem, "DeviceFingerprint"], bool]


@dataclass(frozen=True)
class Choice:
    """A categorical parameter (kernel variants, small unordered sets)."""

    name: str
    values: tuple[Value, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"Choice {self.name!r} needs at least one value")

    def suggest(self, trial: optuna.trial.BaseTrial) -> Value:
        value: Value = trial.suggest_categorical(self.name, list(self.values))  # type: ignore[assignment]
        return value

    def encode(self, value: Value) -> dict[str, Any]:
        return {self.name: value}


@dataclass(frozen=True)
class PowerOfTwo:
    """An ordered parameter over powers of two; the sampler sees the exponent so it learns the order."""

    name: str
    low: int
    high: int

    def __post_init__(self) -> None:
        for bound in (self.low, self.high):
            if bound < 1 or bound & (bound - 1):
                raise ValueError(f"PowerOfTwo {self.name!r}: bounds must be powers of two, got {bound}")
        if self.low > self.high:
            raise ValueError(f"PowerOfTwo {self.name!r}: low <= high must hold, got ({self.low}, {self.high})")

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(1 << e for e in range(self.low.bit_length() - 1, self.high.bit_length()))

    @property
    def optuna_name(self) -> str:
        return f"log2_{self.name}"

    def suggest(self, trial: optuna.trial.BaseTrial) -> Value:
        lo, hi = int(math.log2(self.low)), int(math.log2(self.high))
        return 1 << trial.suggest_int(self.optuna_name, lo, hi)

    def encode(self, value: Value) -> dict[str, Any]:
        return {self.optuna_name: int(value).bit_length() - 1}


Param = Choice | PowerOfTwo


@dataclass(frozen=True)
class Rule:
    """A named constraint. `check` is pure: (config, problem, device) -> bool, True when allowed."""

    name: str
    check: Predicate
    why: str = ""


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    rules: tuple[Rule, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def size(self) -> int:
        return math.prod(len(p.values) for p in self.params)

    def all_configs(self) -> Iterator[dict[str, Value]]:
        """Every point of the space, constraints ignored, in a fixed order."""
        names = self.names  # once: a property, and GEMM's space has 24,000 points
        for combo in itertools.product(*(p.values for p in self.params)):
            yield dict(zip(names, combo))

    def violations(self, config: Config, problem: Problem, device: DeviceFingerprint) -> list[str]:
        return [rule.name for rule in self.rules if not rule.check(config, problem, device)]

    def is_valid(self, config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
        return all(rule.check(config, problem, device) for rule in self.rules)

    def valid_configs(self, problem: Problem, device: DeviceFingerprint) -> list[dict[str, Value]]:
        return [c for c in self.all_configs() if self.is_valid(c, problem, device)]

    def check_membership(self, config: Mapping[str, Any]) -> dict[str, Value]:
        """Refuse a config whose names or values lie outside the space (imports, hand-written configs)."""
        if not isinstance(config, Mapping):
            raise InvalidConfigError(f"a config must be an object, but got {type(config).__name__}")
        if set(config) != set(self.names):
            raise InvalidConfigError(
                f"config parameters must be exactly {sorted(self.names)}, but got {sorted(map(str, config))}"
            )
        for p in self.params:
            value = config[p.name]
            # bool is an int subclass: require the exact type of the declared values.
            if not any(type(value) is type(v) and value == v for v in p.values):
                raise InvalidConfigError(
                    f"config parameter {p.name!r} must be one of {list(p.values)}, but got {value!r}"
                )
        return {p.name: config[p.name] for p in self.params}

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Value]:
        return {p.name: p.suggest(trial) for p in self.params}

    def encode(self, config: Config) -> dict[str, Any]:
        """The config as Optuna parameters (for enqueueing seeds)."""
        encoded: dict[str, Any] = {}
        for p in self.params:
            encoded.update(p.encode(config[p.name]))
        return encoded


def config_id(config: Config) -> tuple[tuple[str, Value], ...]:
    """A hashable identity for a config: the same config always gives the same id."""
    return tuple(sorted(config.items()))
