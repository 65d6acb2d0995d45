"""Search strategies by name. Exhaustive is not an Optuna sampler: the tuner enqueues every valid config."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from tunekit.errors import TunekitError


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=8)


def _random(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": _tpe,
    "random": _random,
    "exhaustive": _random,  # only answers after the enqueued configs run out, which exhaustive never reaches
}
DEFAULT_SAMPLER = "tpe"


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    factory = SAMPLERS.get(name)
    if factory is None:
        raise TunekitError(f"unknown sampler {name!r}. Available: {sorted(SAMPLERS)}")
    return factory(seed)
