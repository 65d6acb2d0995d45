"""Search strategies by name. Exhaustive is not an Optuna sampler: the tuner enqueues every valid config."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from tunekit.core.errors import TunekitError


def _tpe(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=8)


def _gp(seed: int) -> optuna.samplers.BaseSampler:
    try:
        import scipy  # noqa: F401  # Optuna's GPSampler imports it lazily, at the first trial
    except ImportError as exc:
        raise TunekitError("the gp strategy needs scipy: pip install 'tunekit-triton[gp]'") from exc
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8)


def _random(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "model": _tpe,  # TPE over the configs the quantization model keeps, its top-modelled configs first
    "tpe": _tpe,
    "gp": _gp,
    "random": _random,
    "exhaustive": _random,  # only answers after the enqueued configs run out, which exhaustive never reaches
}
DEFAULT_SAMPLER = "model"  # TPE where the model has nothing to say (the interpreter, kernels without a geometry)


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    factory = SAMPLERS.get(name)
    if factory is None:
        raise TunekitError(f"unknown sampler {name!r}. Available: {sorted(SAMPLERS)}")
    return factory(seed)
