"""The quantization model's part in one search (the `model` strategy): prune, rank and seed the candidates, share the
entry of a problem that quantizes alike, warm-start from the nearest tuned problem, then pattern-search from the
incumbent."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tunekit.core.device import DeviceFingerprint
from tunekit.core.device_limits import DeviceLimits, device_limits
from tunekit.core.space import Config, Problem, Value, config_id
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import Entry
from tunekit.store.nearest import nearest_entry
from tunekit.tuning import early_stop, perf_model
from tunekit.tuning.candidates import Candidates
from tunekit.tuning.ranker import Ranker, shipped_ranker, usable_ranker
from tunekit.tuning.roofline import arch_for

MODEL_SEEDS = 8  # top-modelled configs measured right after the heuristic (one per tile family first)


@dataclass
class ModelGuide:
    """What the quantization model contributes to one search (the `model` strategy)."""

    kept: list[dict[str, Value]]  # valid configs the model did not prune, best modelled first
    pruned: int
    seeds: list[dict[str, Value]]
    nearest: list[Entry]  # the nearest tuned problem's entry, for warm-starting
    shared: Entry | None  # an entry of a problem with the same quantization signature
    dependent: frozenset[str] = frozenset()  # the kernel's dependent_params (KernelSpec): see _neighbours
    # The ranker's top pick, measured first (before the hand heuristic); None without a fitted ranker, where the
    # modelled order alone picks worse first configs than the heuristic (tunekit efficiency's first column).
    first: dict[str, Value] | None = None
    # Modelled time (ranked_clk) by config identity, for the early-stopping rule (tunekit.tuning.early_stop).
    modelled: dict[Any, float] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        spec: KernelSpec,
        problem: Problem,
        device: DeviceFingerprint,
        sampler: str,
        limits: DeviceLimits | None,
        tuned: Iterable[Entry],
        valid: list[dict[str, Value]],
        ranker: Ranker | None = None,
    ) -> ModelGuide | None:
        if sampler != "model":
            return None
        if limits is None and not device.is_interpreter:
            limits = device_limits()
        if limits is None or perf_model.kernel_model(spec.name) is None:
            return None  # the interpreter has no SMs to model; the strategy is plain TPE there
        arch = arch_for(device.compute_capability)
        scope = (spec.name, spec.source_hash, device.key)
        others = [e for e in tuned if e.key.scope == scope and dict(e.key.problem) != dict(problem)]
        shared = _same_quantization(spec, problem, device, limits, others)
        if shared is not None:
            return cls([], 0, [], [], shared)
        ranker = usable_ranker(ranker if ranker is not None else shipped_ranker(spec.name))
        pruning = perf_model.prune(spec.name, valid, problem, limits, arch=arch, ranker=ranker)
        ranked = perf_model.rank(
            spec.name, pruning.kept if pruning else valid, problem, limits, arch=arch, ranker=ranker
        )
        kept = [q.config for q in ranked] if ranked is not None else valid
        seeds = perf_model.seed_configs(spec.name, kept, problem, limits, MODEL_SEEDS, arch=arch, ranker=ranker) or []
        near = nearest_entry(spec, problem, device, others)
        pruned = len(pruning.pruned) if pruning else 0
        first = kept[0] if kept and ranker is not None else None
        modelled = {config_id(q.config): q.ranked_clk for q in ranked or () if math.isfinite(q.ranked_clk)}
        return cls(kept, pruned, seeds, [near] if near else [], None, spec.dependent_params, first, modelled)

    def nothing_left_to_gain(self, seen: Candidates, noise: float) -> bool:
        """The early-stopping rule (tunekit.tuning.early_stop) over what is measured and what is left."""
        measured = [(self.modelled[i], r.time_ms or 0.0) for i, r in seen.by_id.items()
                    if r.status == "ok" and i in self.modelled]  # fmt: skip
        remaining = (self.modelled[i] for i in map(config_id, self.kept) if i in self.modelled and i not in seen.by_id)
        return early_stop.nothing_left_to_gain(measured, remaining, noise)

    def next_config(self, seen: Candidates) -> dict[str, Value] | None:
        """Pattern search from the fastest config measured so far: its unmeasured neighbours (one parameter
        changed, plus the parameters the space's rules then pin), best modelled first. None once every
        neighbour of the incumbent is measured: the sampler takes over.
        """
        ok = seen.ok()
        if not ok:
            return None
        incumbent = ok[0].config
        for config in self.kept:
            if config not in seen and _neighbours(config, incumbent, self.dependent):
                return config
        return None


def _same_quantization(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, limits: DeviceLimits, others: list[Entry]
) -> Entry | None:
    """A tuned entry whose problem has this problem's quantization signature (and a config valid here)."""
    sizes = perf_model.signature(spec.name, problem, spec.space, limits)
    mine: tuple[object, ...] | None = None  # with the allowed-config set: enumerates the space, so only on demand
    for entry in others:
        theirs = dict(entry.key.problem)
        if perf_model.signature(spec.name, theirs, spec.space, limits) != sizes:
            continue
        if mine is None:
            mine = perf_model.signature(spec.name, problem, spec.space, limits, device=device)
        if perf_model.signature(spec.name, theirs, spec.space, limits, device=device) == mine and spec.space.is_valid(
            entry.config, problem, device
        ):
            return entry
    return None


def _neighbours(a: Config, b: Config, dependent: frozenset[str]) -> bool:
    """One parameter changed; a move that also changes `dependent` ones (parameters the space's rules pin once
    another changes, declared by the kernel) still counts as one step."""
    changed = {name for name in a if a[name] != b.get(name)}
    return len(changed - dependent) == 1 or len(changed) == 1
