"""One launch of a user kernel, as `triton.autotune` makes it: the call's arguments, a config's meta-parameters and
launch options, and the hooks (`reset_to_zero`, `restore_value`, `pre_hook`, `post_hook`, a config's `pre_hook`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triton import Config as TritonConfig

from tunekit.core.errors import InvalidInputError

PreHook = Callable[..., object]
PostHook = Callable[..., object]


@dataclass(frozen=True)
class Call:
    """A launch's arguments: positional ones by name (in the kernel's order), the others as given, and the grid."""

    kernel: str
    named: dict[str, Any]
    extra: dict[str, Any]  # keyword arguments that are not kernel arguments (launch options, ...)
    grid: Any
    by_keyword: frozenset[str] = frozenset()  # the kernel arguments passed by name

    @classmethod
    def bind(
        cls, kernel: str, arg_names: Sequence[str], grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Call:
        named = dict(zip(arg_names, args))
        extra: dict[str, Any] = {}
        for name, value in kwargs.items():
            (named if name in arg_names else extra)[name] = value
        return cls(kernel, named, extra, grid, frozenset(kwargs) & frozenset(arg_names))

    def with_named(self, named: dict[str, Any]) -> Call:
        return Call(self.kernel, named, self.extra, self.grid, self.by_keyword)

    def as_triton_passes(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the arguments passed by position, by name; the keywords), as triton.autotune hands them to
        `early_config_prune(configs, named_args, **kwargs)`."""
        positional = {k: v for k, v in self.named.items() if k not in self.by_keyword}
        keywords = {k: v for k, v in self.named.items() if k in self.by_keyword}
        return positional, {**keywords, **self.extra}

    def meta(self, config: TritonConfig) -> dict[str, Any]:
        """The keyword arguments of a launch under `config`; a meta-parameter given both ways is refused, as
        triton.autotune refuses it."""
        tuned = config.all_kwargs()
        conflicts = sorted((set(self.named) | set(self.extra)) & set(tuned))
        if conflicts:
            raise InvalidInputError(
                f"{self.kernel}: {conflicts} are tuned (they are in the configs) and must not be passed at launch"
            )
        return {**self.named, **self.extra, **tuned}


@dataclass(frozen=True)
class Hooks:
    """triton.autotune's hooks with its semantics: the user's pre_hook/post_hook replace the reset/restore ones."""

    reset_to_zero: tuple[str, ...] = ()
    restore_value: tuple[str, ...] = ()
    pre_hook: PreHook | None = None
    post_hook: PostHook | None = None
    _copies: dict[str, Any] = field(default_factory=dict)

    def pre(self, nargs: Mapping[str, Any], reset_only: bool = False) -> None:
        if self.pre_hook is not None:
            self.pre_hook(nargs, reset_only=True) if reset_only else self.pre_hook(nargs)
            return
        for name in self.reset_to_zero:
            if nargs[name] is not None:  # an optional tensor passed as None
                nargs[name].zero_()
        if not reset_only:
            self._copies.clear()
            self._copies.update({name: nargs[name].clone() for name in self.restore_value if nargs[name] is not None})

    def post(self, nargs: Mapping[str, Any], exception: BaseException | None) -> None:
        if self.post_hook is not None:
            self.post_hook(nargs, exception=exception)
            return
        for name in self.restore_value:
            if name in self._copies:
                nargs[name].copy_(self._copies[name])
        self._copies.clear()


def launch(fn: Any, call: Call, config: TritonConfig, hooks: Hooks | None) -> None:
    """One launch of jit function `fn` under `config`; with `hooks`, a benchmark's launch (as triton.autotune's)."""
    kwargs = call.meta(config)
    if config.pre_hook is not None:
        config.pre_hook(kwargs)
    if hooks is None:
        fn.run(grid=call.grid, warmup=False, **kwargs)
        return
    hooks.pre(kwargs)
    try:
        fn.run(grid=call.grid, warmup=False, **kwargs)
    except Exception as exc:
        hooks.post(kwargs, exception=exc)
        raise
    hooks.post(kwargs, exception=None)
