"""A user kernel's candidates: a list of `triton.Config`s, or a tunekit search space. Configs as stored data.

A stored config is a flat dict of the kernel's meta-parameters and its launch options (`num_warps`, `num_stages`,
`num_ctas`, and `maxnreg` where set), each a string, bool or int. A stored config is served only if it is one of the
kernel's current candidates: a member of its config list, or of its space within the space's rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from triton import Config as TritonConfig

from tunekit.core.canonical import digest
from tunekit.core.errors import InvalidConfigError, TunekitError
from tunekit.core.identity import space_digest
from tunekit.core.space import Config, Problem, SearchSpace, Value, config_id

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
_DEFAULT_OPTIONS: dict[str, Value] = {"num_warps": 4, "num_stages": 3, "num_ctas": 1}


def _scalar(value: object) -> bool:
    return isinstance(value, (str, bool)) or (isinstance(value, int) and abs(value) < 2**53)


def as_dict(config: TritonConfig) -> dict[str, Value]:
    """A triton.Config as stored data; a float or object meta-parameter cannot be stored and is refused."""
    data: dict[str, object] = dict(config.kwargs)
    for name in LAUNCH_OPTIONS:
        value = getattr(config, name, None)
        if value is not None:
            data[name] = value
    bad = {name: value for name, value in data.items() if not _scalar(value)}
    if bad:
        raise InvalidConfigError(
            f"tunekit.autotune stores configs whose values are strings, bools or ints, but got {bad}"
        )
    return {name: value for name, value in data.items() if _scalar(value)}  # type: ignore[misc]


def as_triton(config: Config) -> TritonConfig:
    """A stored (or space) config as a triton.Config: launch options apart from meta-parameters."""
    meta = {name: value for name, value in config.items() if name not in LAUNCH_OPTIONS}
    options = {**_DEFAULT_OPTIONS, **{name: config[name] for name in LAUNCH_OPTIONS if name in config}}
    return TritonConfig(meta, **options)


@dataclass(frozen=True)
class Candidates:
    """The configs a kernel may be served: an explicit list, or a space (parameters and rules)."""

    configs: tuple[TritonConfig, ...] = ()
    space: SearchSpace | None = None

    @classmethod
    def make(cls, configs: Sequence[TritonConfig] | None, space: SearchSpace | None) -> Candidates:
        if space is not None and configs:
            raise TunekitError("tunekit.autotune takes configs= or space=, not both")
        if space is not None:
            return cls((), space)
        listed = tuple(configs or ()) or (TritonConfig({}),)  # triton.autotune's default: one config
        for config in listed:
            if not isinstance(config, TritonConfig):
                raise TunekitError(f"configs= must be triton.Config objects, but got {type(config).__name__}")
            as_dict(config)  # a config that cannot be stored is said at decoration, not at the first call
        return cls(listed, None)

    @property
    def single(self) -> TritonConfig | None:
        """The one config of a one-config list (served without tuning, as triton.autotune does)."""
        return self.configs[0] if self.space is None and len(self.configs) == 1 else None

    def digest(self) -> str:
        """What the candidates are, for the kernel's identity: a changed list or space retires the entries."""
        if self.space is not None:
            return space_digest(self.space.params)
        return digest(sorted(sorted(as_dict(c).items()) for c in self.configs), 8)

    def by_id(self) -> dict[tuple[tuple[str, Value], ...], TritonConfig]:
        return {config_id(as_dict(c)): c for c in self.configs}

    def find(self, config: Config, problem: Problem, device: DeviceFingerprint) -> TritonConfig | None:
        """The candidate a stored config names, or None when it is not one of them (never served)."""
        if self.space is None:
            return self.by_id().get(config_id(config))
        try:
            member = self.space.check_membership(config)
        except InvalidConfigError:
            return None
        return as_triton(member) if self.space.is_valid(member, problem, device) else None
