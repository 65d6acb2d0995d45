"""What an untuned problem runs when torch is not what serves it: the learned ranker's top pick.

The dispatch chain (tunekit.runtime.dispatch) asks here before it falls back to the kernel's hand heuristic. It
needs no measurement and no Optuna: the quantization model ranks the valid configs on this device's limits, with
the shipped ranker's correction (tunekit.tuning.ranker). Leave-one-shape-out on the recorded tables, that first pick
is within 10% of the best config more often than the heuristic is (`tunekit efficiency`, its first column).
"""

from __future__ import annotations

from tunekit.core.device import DeviceFingerprint
from tunekit.core.device_limits import DeviceLimits, device_limits
from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec
from tunekit.tuning import perf_model
from tunekit.tuning.ranker import shipped_ranker, usable_ranker
from tunekit.tuning.roofline import arch_for


def model_pick(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, limits: DeviceLimits | None = None
) -> Config | None:
    """The ranker's top launchable config for `problem` on `device`; None where the kernel has no model or no
    confident shipped ranker, or the device has no limits to model (the interpreter)."""
    ranker = usable_ranker(shipped_ranker(spec.name))
    if ranker is None or spec.model is None or device.is_interpreter:
        return None
    limits = limits if limits is not None else device_limits()
    if limits is None:
        return None
    valid = spec.space.valid_configs(problem, device)
    arch = arch_for(device.compute_capability)
    ranked = perf_model.rank(spec.name, valid, problem, limits, arch=arch, ranker=ranker)
    launchable = [q for q in ranked or () if q.launchable]
    return dict(launchable[0].config) if launchable else None
