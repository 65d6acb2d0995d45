"""The tile/wave quantization model of a GPU: how a config's work quantizes on a device, before measuring it.

For one config of a kernel and one problem (the kernel's declared `KernelSpec.model` gives the tiles:
tunekit/core/geometry.py), the model computes:
- occupancy: blocks per SM, bounded by registers, shared memory, threads and the block slots of an SM
  (tunekit/core/occupancy.py);
- tiles (the programs a non-persistent launch has), slots = SMs x blocks per SM, waves = ceil(tiles / slots)
  and wave efficiency = tiles / (waves x slots);
- padded waste: the share of the tiles' work that is padding past the problem's edges;
- a predicted time, for ranking (tunekit.tuning.roofline's `predict_clk`).
The tuner uses it to prune configs that cannot launch or are hopeless, to seed the search with the top-modelled
configs, and to let problems that quantize identically share results (`signature`).

Everything takes the device's `DeviceLimits` explicitly (the tuner passes the current device's; a simulation a
recorded table's) and runs on a CPU. Allocation rules and rates are NVIDIA's (sm_70 onwards). Times are in SM
clocks and only their ratios matter. Kernels are named as the registry names them; one without a declared model
gets None from every function here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from tunekit.core.device_limits import DeviceLimits
from tunekit.core.geometry import Geometry, KernelModel
from tunekit.core.occupancy import Occupancy, Resources, occupancy
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, Problem, SearchSpace, Value, config_id
from tunekit.tuning.ranker import Ranker, features
from tunekit.tuning.roofline import DEFAULT_ARCH, Arch, ideal_clk, predict_clk

if TYPE_CHECKING:
    from typing import Unpack

    from tunekit.core.device import DeviceFingerprint

ConfigId = tuple[tuple[str, Value], ...]


def kernel_model(kernel: str) -> KernelModel | None:
    """The model a kernel declares (`KernelSpec.model`), or None (the tuner then searches without the model)."""
    return get_spec(kernel).model


def geometry(kernel: str, config: Config, problem: Problem, warp_size: int = 32) -> Geometry | None:
    """How one config of the kernel decomposes one problem into programs; None without a model."""
    model = kernel_model(kernel)
    return None if model is None else model.geometry(config, problem, warp_size)


# A config is hopeless when its predicted time exceeds this many times the best predicted time. Each modelled time
# can be off by about 2x (the rates, tunekit.tuning.roofline's, are known to within about 2x; the model ignores L2
# hit rates, instruction overheads and code generation), so two configs under 4x apart could swap places when
# measured; beyond 4x a config loses even with both errors in its favour. Conservative on purpose: pruning the true
# best costs more than a trial.
HOPELESS_RATIO = 4.0


# --------------------------------------------------------------------------------------------------- quantization


@dataclass(frozen=True)
class Quantization:
    """How one config's work quantizes on the device for one problem, and its modelled time."""

    config: dict[str, Value]
    geometry: Geometry
    resources: Resources
    occupancy: Occupancy
    programs_per_sm: int  # resident programs per SM the launch reaches (persistent grids cap it)
    slots: int  # sm_count x programs_per_sm
    grid: int  # programs launched: tiles, or min(tiles, slots) for a persistent kernel
    waves: int  # ceil(tiles / slots); 0 when the config cannot launch
    predicted_clk: float  # modelled time in SM clocks; inf when the config cannot launch
    ideal_clk: float  # the device's roofline for the problem (useful flops, unique bytes)
    corrected_clk: float | None = None  # predicted_clk with the learned ranker's correction (tunekit.tuning.ranker)

    @property
    def ranked_clk(self) -> float:
        """The time ranking and pruning go by: corrected where a ranker was given, else modelled."""
        return self.predicted_clk if self.corrected_clk is None else self.corrected_clk

    @property
    def tiles(self) -> int:
        return self.geometry.tiles

    @property
    def tile_shape(self) -> str:
        return self.geometry.shape

    @property
    def padded_waste(self) -> float:
        return self.geometry.padded_waste

    @property
    def launchable(self) -> bool:
        return self.occupancy.blocks_per_sm > 0

    @property
    def wave_efficiency(self) -> float:
        """tiles / (waves x slots): the share of the slots the waves keep busy."""
        return 0.0 if self.waves == 0 else self.tiles / (self.waves * self.slots)

    @property
    def efficiency(self) -> float:
        """The roofline time over the predicted time: 1.0 is a config that runs at the device's peak."""
        return 0.0 if not math.isfinite(self.predicted_clk) else min(1.0, self.ideal_clk / self.predicted_clk)


def estimated_resources(geometry: Geometry) -> Resources:
    return Resources(geometry.threads, geometry.regs_per_thread, geometry.smem_bytes, "estimated")


def compiled_resources(config: Config, n_regs: int, shared_bytes: int, warp_size: int = 32) -> Resources:
    """A compiled kernel's resources (Triton's CompiledKernel n_regs / metadata.shared, or a timing table row's)."""
    return Resources(warp_size * int(config["num_warps"]), int(n_regs), int(shared_bytes), "compiled")


def quantize_geometry(
    config: Config,
    geometry: Geometry,
    limits: DeviceLimits,
    *,
    arch: Arch = DEFAULT_ARCH,
    resources: Resources | None = None,
) -> Quantization:
    """The quantization of a given geometry (kernel-agnostic: what `quantize` does after the kernel's geometry)."""
    used = resources if resources is not None else estimated_resources(geometry)
    occ = occupancy(used, limits)
    per_sm = occ.blocks_per_sm
    if geometry.max_programs_per_sm is not None:
        per_sm = min(per_sm, geometry.max_programs_per_sm)
    sm_count = max(1, limits.sm_count)
    slots = sm_count * per_sm
    tiles = geometry.tiles
    if per_sm == 0:
        return Quantization(
            dict(config), geometry, used, occ, 0, 0, 0, 0, math.inf, ideal_clk(geometry, sm_count, arch)
        )
    return Quantization(
        config=dict(config),
        geometry=geometry,
        resources=used,
        occupancy=occ,
        programs_per_sm=per_sm,
        slots=slots,
        grid=min(tiles, slots) if geometry.persistent else tiles,
        waves=-(-tiles // slots),
        predicted_clk=predict_clk(geometry, per_sm, sm_count, arch),
        ideal_clk=ideal_clk(geometry, sm_count, arch),
    )


def quantize(
    kernel: str,
    config: Config,
    problem: Problem,
    limits: DeviceLimits,
    *,
    arch: Arch = DEFAULT_ARCH,
    resources: Resources | None = None,
) -> Quantization | None:
    """The quantization of one config on one problem; None for a kernel the model has no geometry for.

    `resources` overrides the estimate (a compiled kernel's registers and shared memory).
    """
    model = kernel_model(kernel)
    if model is None:
        return None
    geometry = model.geometry(config, problem, max(1, limits.warp_size))
    return quantize_geometry(config, geometry, limits, arch=arch, resources=resources)


# ------------------------------------------------------------------------------------------- ranking and pruning

CompiledTable = Mapping[ConfigId, Resources]  # config_id -> compiled resources


class ModelOptions(TypedDict, total=False):
    """The keywords quantize_all, rank, seed_configs and prune take (each passes them on to quantize_all)."""

    arch: Arch  # the per-SM rates the roofline is computed against; DEFAULT_ARCH when absent
    compiled: CompiledTable | None  # compiled resources by config_id, where known; estimates for the others
    ranker: Ranker | None  # a learned correction of the modelled times (tunekit.tuning.ranker); None: none


def quantize_all(
    kernel: str, configs: Iterable[Config], problem: Problem, limits: DeviceLimits, **options: Unpack[ModelOptions]
) -> list[Quantization] | None:
    """`quantize` for every config, in their order; compiled resources (keyed by config_id) where known."""
    if kernel_model(kernel) is None:
        return None
    arch, found, ranker = options.get("arch", DEFAULT_ARCH), options.get("compiled") or {}, options.get("ranker")
    if ranker is not None and ranker.loop_step_clk is not None:
        arch = replace(arch, loop_step_clk=ranker.loop_step_clk)
    result = []
    for config in configs:
        q = quantize(kernel, config, problem, limits, arch=arch, resources=found.get(config_id(config)))
        assert q is not None
        result.append(q if ranker is None else corrected(q, problem, ranker))
    return result


def ranker_features(q: Quantization, problem: Problem) -> dict[str, float]:
    """The learned ranker's features of one quantized config (tunekit.tuning.ranker.features)."""
    return features(
        q.config,
        problem,
        wave_efficiency=q.wave_efficiency,
        padded_waste=q.padded_waste,
        programs_per_sm=q.programs_per_sm,
        roofline_share=q.efficiency,
        tiles={dim.name: dim.tiles for dim in q.geometry.dims},
    )


def corrected(q: Quantization, problem: Problem, ranker: Ranker) -> Quantization:
    """`q` with its modelled time corrected by the ranker (a config that cannot launch stays at inf)."""
    if not math.isfinite(q.predicted_clk) or not ranker.weights:
        return q
    return replace(q, corrected_clk=q.predicted_clk * math.exp(ranker.correction(ranker_features(q, problem))))


# Modelled times closer than this (relative) are ties for ranking: the model cannot tell them apart.
RANK_RESOLUTION = 0.02


def _rank_key(q: Quantization) -> tuple[float, float, int, float, ConfigId]:
    # Within the model's resolution (e.g. every config at the DRAM roofline): less padding first, then more resident
    # programs, then the exact time, then the config itself, so the order never depends on the configs' order.
    tier = math.inf
    if math.isfinite(q.ranked_clk):
        tier = float(math.floor(math.log(max(q.ranked_clk, 1.0)) / math.log1p(RANK_RESOLUTION)))
    return (tier, round(q.padded_waste, 12), -q.programs_per_sm, q.ranked_clk, config_id(q.config))


def rank(
    kernel: str, configs: Iterable[Config], problem: Problem, limits: DeviceLimits, **options: Unpack[ModelOptions]
) -> list[Quantization] | None:
    """The configs' quantizations, best modelled first (configs that cannot launch last); None without a model."""
    quantized = quantize_all(kernel, configs, problem, limits, **options)
    return None if quantized is None else sorted(quantized, key=_rank_key)


def seed_configs(
    kernel: str,
    configs: Iterable[Config],
    problem: Problem,
    limits: DeviceLimits,
    count: int,
    **options: Unpack[ModelOptions],
) -> list[dict[str, Value]] | None:
    """The `count` top-modelled configs to seed a search with; None without a model.

    Family by family (the parameters that fix the grid): the best of each family in rank order, then the second
    best of each, and so on. Parameters the model barely sees (pipeline depth, GROUP_M) would otherwise fill every
    seed with one tile shape. Configs that cannot launch or are hopeless are never seeds.
    """
    model = kernel_model(kernel)
    ranked = rank(kernel, configs, problem, limits, **options)
    if model is None or ranked is None:
        return None
    usable = [q for q in ranked if q.launchable]
    if not usable:
        return []
    bound = HOPELESS_RATIO * min(q.ranked_clk for q in usable)
    families: dict[tuple[object, ...], list[Quantization]] = {}
    for q in usable:
        if q.ranked_clk <= bound:
            families.setdefault(tuple(q.config.get(p) for p in model.family), []).append(q)
    seeds: list[dict[str, Value]] = []
    depth = 0
    while len(seeds) < count and any(depth < len(members) for members in families.values()):
        seeds += [members[depth].config for members in families.values() if depth < len(members)]
        depth += 1
    return seeds[:count]


class Pruning(NamedTuple):
    kept: list[dict[str, Value]]  # in the order the configs came in
    pruned: list[tuple[dict[str, Value], str]]  # (config, reason); a reason's kind is the text before ':'


def reason_kind(reason: str) -> str:
    """The category of a pruning reason ("cannot launch (shared_memory)", "hopeless"): for counting."""
    return reason.split(":", 1)[0]


def prune(
    kernel: str,
    configs: Iterable[Config],
    problem: Problem,
    limits: DeviceLimits,
    *,
    hopeless_ratio: float = HOPELESS_RATIO,
    **options: Unpack[ModelOptions],
) -> Pruning | None:
    """Drop configs that cannot launch (0 blocks per SM) and configs predicted slower than hopeless_ratio x the
    best modelled config. The best-modelled config always survives, even where nothing can launch by the estimate
    (an estimate can be wrong; a measurement settles it). None for a kernel without a model.
    """
    config_list = [dict(c) for c in configs]
    quantized = quantize_all(kernel, config_list, problem, limits, **options)
    if quantized is None:
        return None
    if not quantized:
        return Pruning([], [])
    best = min(quantized, key=_rank_key)
    fastest = min(q.ranked_clk for q in quantized)
    kept: list[dict[str, Value]] = []
    pruned: list[tuple[dict[str, Value], str]] = []
    for q in quantized:
        if q is best:
            kept.append(q.config)
        elif not q.launchable:
            pruned.append((q.config, f"cannot launch ({q.occupancy.limiter}): {q.occupancy.why_not}"))
        elif q.ranked_clk > hopeless_ratio * fastest:
            ratio = q.ranked_clk / fastest
            pruned.append((q.config, f"hopeless: modelled {ratio:.1f}x the best modelled time (> {hopeless_ratio:g}x)"))
        else:
            kept.append(q.config)
    return Pruning(kept, pruned)


# ------------------------------------------------------------------------------------------------------ signature


def signature(
    kernel: str,
    problem: Problem,
    space: SearchSpace,
    limits: DeviceLimits,
    *,
    device: DeviceFingerprint | None = None,
) -> tuple[object, ...] | None:
    """A config-independent quantization signature of a problem on a device; None without a model.

    Two problems with equal signatures quantize identically for every config of the space: the same tiles along
    every dimension for every tile size the space has, the same K steps / chunks per row and padded extents, the
    same block bounds the space's rules read (next power of two of each size) and the same alignment the kernels
    specialise on; and every field of the problem that is not a size (dtype, layouts, epilogue) is equal. Only
    the count of masked-off elements can differ. The device's limits are part of it: slots, hence waves, are
    the device's.

    With `device`, the signature also holds which configs the space's rules allow (exact, whatever the rules
    read: a rule may bound a product of sizes, e.g. a split-K workspace); that enumerates the space once.
    """
    model = kernel_model(kernel)
    if model is None:
        return None
    signed: tuple[object, ...] = (
        kernel,
        tuple(sorted((k, v) for k, v in problem.items() if k not in model.size_fields)),  # dtype, layouts, ...
        model.size_classes(problem, space),
        tuple(sorted(limits.to_json().items())),
    )
    if device is not None:
        allowed = [i for i, c in enumerate(space.all_configs()) if space.is_valid(c, problem, device)]
        signed += (hashlib.sha256(repr(allowed).encode()).hexdigest(),)
    return signed
