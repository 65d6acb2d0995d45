"""`tunekit.autotune`: a drop-in replacement for `@triton.autotune` with tunekit's store behind it.

    @tunekit.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), ...], key=["n"])
    @triton.jit
    def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr): ...

    kernel[grid](x, y, n)   # launched as before

Per launch: in-process memo (a dict lookup) -> tunekit's store (or a database the package ships) under this kernel's
identity, this device and this key -> measure (and store the best). A second process serves the stored best without
measuring; an entry tuned for other code is stale: never served, said in one warning, measured again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton import Config as TritonConfig

from tunekit.core.errors import TunekitError
from tunekit.core.render import brief
from tunekit.core.space import SearchSpace, Value
from tunekit.core.spec import Tolerance
from tunekit.core.triton_adapter import KernelInterface, arg_names, python_function
from tunekit.store.entry import Entry
from tunekit.store.user_entries import check_import_path
from tunekit.user_kernels.configs import Candidates
from tunekit.user_kernels.key import KeyMaker
from tunekit.user_kernels.launch import Call, Hooks, PostHook, PreHook
from tunekit.user_kernels.search import DoBench, Searcher, make_timer
from tunekit.user_kernels.stored import StoredKernel, describe
from tunekit.user_kernels.verify import DEFAULT_TOLERANCES, Reference

# A launch of a stored key, for tuning from a plan: problem -> (grid, args, kwargs).
Inputs = Callable[[dict[str, Value]], tuple[Any, Sequence[Any], Mapping[str, Any]]]

logger = logging.getLogger("tunekit")

__all__ = ["Autotuned", "Stats", "autotune"]


@dataclass
class Stats:
    """What a kernel did in this process: tests and scripts assert on these."""

    benchmarks: int = 0  # configs benchmarked (a config that fails while timed counts, as in triton.autotune)
    measured: int = 0  # keys measured here
    stored: int = 0  # keys served from the store or a shipped database, without measuring
    stale: int = 0  # keys whose stored entry was tuned for other code (not served)


class Autotuned(KernelInterface[Any]):
    """A jit function with tuned configs: `kernel[grid](*args)` launches it with the best config for its key."""

    def __init__(
        self,
        fn: Any,
        candidates: Candidates,
        key: Sequence[str],
        name: str,
        hooks: Hooks,
        searcher: Searcher,
        databases: Sequence[Path],
        inputs: Inputs | None = None,
    ) -> None:
        self.fn = fn
        self.inputs = inputs
        self.name = name
        self.arg_names: list[str] = arg_names(fn) or []
        self.candidates = candidates
        self.key_maker = KeyMaker.make(name, self.arg_names, key)
        self.keys = list(key)  # as triton.autotune's Autotuner: the key names, and its candidate configs
        self.configs = list(candidates.configs)
        self.hooks = hooks
        self.searcher = searcher
        searcher.count = self._count
        self.stored = StoredKernel(name, fn, candidates, tuple(databases))
        self.stats = Stats()
        self.cache: dict[tuple[Any, ...], TritonConfig] = {}  # as triton.autotune's: memo key -> config
        self.best_config: TritonConfig | None = None
        self._single = candidates.single
        # id(config) -> (config, its launch kwargs): the config is held, so its id is never another config's
        self._tuned_kwargs: dict[int, tuple[TritonConfig, dict[str, Any]]] = {}

    def _count(self, n: int) -> None:
        self.stats.benchmarks += n

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        """The hot path once a key is known: its memo key, a dict lookup, the launch (as triton.autotune's)."""
        if self._single is not None:
            config = self._single
        else:
            memo = self.key_maker.memo_key(args, kwargs)
            config = self.cache.get(memo)
            if config is None:
                config = self.cache[memo] = self._resolve(Call.bind(self.name, self.arg_names, grid, args, kwargs))
        self.best_config = config
        held = self._tuned_kwargs.get(id(config))
        if held is None or held[0] is not config:
            held = self._tuned_kwargs[id(config)] = (config, config.all_kwargs())
        tuned = held[1]
        if config.pre_hook is not None:
            config.pre_hook({**dict(zip(self.arg_names, args)), **kwargs, **tuned})
        return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs, **tuned)

    def _resolve(self, call: Call) -> TritonConfig:
        """The config for a key not yet seen in this process: stored (and still one of the candidates), or measured."""
        problem = self.key_maker.problem(call.named)
        entry = self.stored.lookup(problem, lambda config: self.searcher.check(self.stored, call, problem, config))
        if entry is not None:
            config = self.candidates.find(entry.config, problem, self.stored.device)
            if config is not None:
                self.stats.stored += 1
                return config
            logger.warning(
                "tunekit: %s: the stored config %s for %s is not one of the kernel's candidates; measuring instead",
                self.name,
                entry.config,
                describe(problem),
            )
        elif self.stored.stale(problem):
            self.stats.stale += 1
        pruned = self.searcher.prune(call) if self.candidates.space is None else None
        if pruned is not None and len(pruned) == 1 and self.searcher.reference is None:
            return pruned[0]  # as triton.autotune: the one config pruning leaves is launched, not benchmarked
        measured = self.searcher.measure(self.stored, call, problem, pruned)
        self.stored.record(measured)  # merged with what is there; this process serves what it measured
        self.stats.measured += 1
        config = self.candidates.find(measured.config, problem, self.stored.device)
        assert config is not None, "the searcher measures only candidates"
        self.hooks.pre(call.meta(config), reset_only=True)  # as triton.autotune does after benchmarking
        return config

    def tune(self, problem: Mapping[str, Value], force: bool = False) -> tuple[Entry, int]:
        """Tune `problem` (a stored key, as a plan names it) without a caller's launch: the kernel's `inputs=`
        builds one. Returns the stored entry and how many configs were benchmarked (0: already tuned)."""
        if self.inputs is None:
            raise TunekitError(
                f"{self.name} declares no inputs=: a plan cannot launch it (give tunekit.autotune(inputs=...) a "
                "function of a problem returning (grid, args, kwargs))"
            )
        grid, args, kwargs = self.inputs(dict(problem))
        call = Call.bind(self.name, self.arg_names, grid, tuple(args), dict(kwargs))
        launched = self.key_maker.problem(call.named)
        if launched != dict(problem):
            raise TunekitError(f"{self.name}: inputs({dict(problem)}) launches another problem, {launched}")
        stored = self.stored.lookup(launched)
        if stored is not None and not force and self.candidates.find(stored.config, launched, self.stored.device):
            return stored, 0
        before = self.stats.benchmarks
        self.stored.stale(launched)
        measured = self.searcher.measure(self.stored, call, launched)
        return self.stored.record(measured), self.stats.benchmarks - before

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> list[Any]:
        """Compile every candidate of a config list without running it, as triton.autotune's `warmup` does."""
        call = Call.bind(self.name, self.arg_names, grid, args, kwargs)
        return [self.fn.warmup(*args, grid=grid, **kwargs, **c.all_kwargs()) for c in self.searcher.prune(call)]

    def forget_memo(self) -> None:
        """Drop the in-process memo (the store keeps its entries)."""
        self.cache.clear()
        self._tuned_kwargs.clear()

    def problem_of(self, *args: Any, **kwargs: Any) -> dict[str, Value]:
        """The stored key of a launch with these arguments (what `tunekit show` lists)."""
        return self.key_maker.problem(Call.bind(self.name, self.arg_names, None, args, kwargs).named)


def _default_name(fn: Any) -> str:
    """The jit function's import path; a function built inside another (a kernel factory) is named without the
    `<locals>` steps, which no import path holds."""
    base = python_function(fn)
    qualname = str(getattr(base, "__qualname__", getattr(base, "__name__", "?"))).replace("<locals>.", "")
    return f"{getattr(base, '__module__', '?')}:{qualname}"


def _checked_name(name: str | None, fn: Any) -> str:
    """The kernel's name, refused at decoration when `tunekit import` would refuse its entries (one rule for both)."""
    kernel = name if name is not None else _default_name(fn)
    try:
        return check_import_path(kernel)
    except TunekitError:
        given = "name=" if name is not None else "the default name"
        raise TunekitError(
            f"tunekit.autotune: {given} {brief(kernel)} would store entries that "
            "`tunekit import` refuses: a user kernel is named by its import path; give "
            "tunekit.autotune(name='package.module:attribute'), the path a plan imports it by"
        ) from None


def autotune(
    configs: Sequence[TritonConfig] | None = None,
    key: Sequence[str] = (),
    prune_configs_by: Mapping[str, Any] | None = None,
    reset_to_zero: Iterable[str] | None = None,
    restore_value: Iterable[str] | None = None,
    pre_hook: PreHook | None = None,
    post_hook: PostHook | None = None,
    warmup: float | None = None,
    rep: float | None = None,
    use_cuda_graph: bool = False,
    do_bench: DoBench | None = None,
    cache_results: bool = False,
    *,
    space: SearchSpace | None = None,
    reference: Reference | None = None,
    tolerances: Mapping[str, Tolerance] | None = None,
    trials: int = 30,
    name: str | None = None,
    databases: Sequence[Path | str] = (),
    inputs: Inputs | None = None,
) -> Callable[[Any], Autotuned]:
    """Decorate a `@triton.jit` function as `triton.autotune` does (same arguments, in its order), with tunekit's store
    behind it. `cache_results` is accepted and always on: the store keeps every key's best across processes.

    tunekit's own arguments (keyword-only):
    - `space`: a tunekit SearchSpace (parameters and rules) instead of `configs`, searched with Optuna for `trials`
      configs. Its rules see the problem: the key arguments by name and `dtype.<argument>` for tensors.
    - `reference(args) -> {output argument: expected tensor}`: every candidate is checked on fresh random inputs with
      its outputs poisoned; `tolerances` per dtype name (default: DEFAULT_TOLERANCES). A wrong config is never served.
    - `name`: the kernel's import path `package.module:attribute` (default: its jit function's); entries and plans
      name the kernel by it.
    - `databases`: tunekit databases (JSON written by `tunekit export`) shipped with the package, read-only, served
      after the working store.
    - `inputs(problem) -> (grid, args, kwargs)`: a launch of a stored key (random data), so that `tunekit tune --plan`
      can tune the kernel from a plan naming it by import path.
    """
    candidates = Candidates.make(configs, space)
    hooks = Hooks(tuple(reset_to_zero or ()), tuple(restore_value or ()), pre_hook, post_hook)

    def decorator(fn: Any) -> Autotuned:
        if arg_names(fn) is None:
            raise TunekitError(f"tunekit.autotune decorates a @triton.jit function, but got {type(fn).__name__}")
        kernel = _checked_name(name, fn)
        searcher = Searcher(
            kernel,
            fn,
            candidates,
            hooks,
            make_timer(do_bench, warmup, rep, use_cuda_graph),
            reference,
            dict(tolerances or DEFAULT_TOLERANCES),
            prune_configs_by,
            trials,
        )
        return Autotuned(fn, candidates, key, kernel, hooks, searcher, [Path(p) for p in databases], inputs)

    return decorator
