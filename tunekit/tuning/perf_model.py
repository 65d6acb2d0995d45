"""The tile/wave quantization model of a GPU: how a config's work quantizes on a device, before measuring it.

For one config of a kernel and one problem (the kernel's declared `KernelSpec.model` gives the tiles:
tunekit/core/geometry.py), the model computes:
- occupancy: blocks per SM, bounded by registers, shared memory, threads and the block slots of an SM
  (tunekit/core/occupancy.py);
- tiles (the programs a non-persistent launch has), slots = SMs x blocks per SM, waves = ceil(tiles / slots)
  and wave efficiency = tiles / (waves x slots);
- padded waste: the share of the tiles' work that is padding past the problem's edges;
- a predicted time, for ranking (see `predict_clk`).
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
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypedDict

from tunekit.core.device_limits import DeviceLimits
from tunekit.core.geometry import Geometry, KernelModel, Math
from tunekit.core.occupancy import Occupancy, Resources, occupancy
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, Problem, SearchSpace, Value, config_id
from tunekit.tuning.ranker import Ranker, features

if TYPE_CHECKING:
    from typing import Unpack

    from tunekit.core.device import DeviceFingerprint

ConfigId = tuple[tuple[str, Value], ...]


class CompiledRow(Protocol):
    """A measured config with its compiled resources (a timing table's row, tunekit.evaluation.timing_table)."""

    @property
    def config(self) -> dict[str, Value]: ...

    @property
    def n_regs(self) -> int | None: ...

    @property
    def shared_bytes(self) -> int | None: ...


def kernel_model(kernel: str) -> KernelModel | None:
    """The model a kernel declares (`KernelSpec.model`), or None (the tuner then searches without the model)."""
    return get_spec(kernel).model


def geometry(kernel: str, config: Config, problem: Problem, warp_size: int = 32) -> Geometry | None:
    """How one config of the kernel decomposes one problem into programs; None without a model."""
    model = kernel_model(kernel)
    return None if model is None else model.geometry(config, problem, warp_size)


# A config is hopeless when its predicted time exceeds this many times the best predicted time. Each modelled time
# can be off by about 2x (the rates below are known to within about 2x; the model ignores L2 hit rates, instruction
# overheads and code generation), so two configs under 4x apart could swap places when measured; beyond 4x a config
# loses even with both errors in its favour. Conservative on purpose: pruning the true best costs more than a trial.
HOPELESS_RATIO = 4.0


@dataclass(frozen=True)
class Arch:
    """Per-SM rates of one architecture generation: what a tile's roofline is computed against."""

    name: str
    tensor_flops_per_clk: float  # dense fp16/bf16 tensor-core flops per clock per SM (fp32 accumulation)
    tf32_flops_per_clk: float  # fp32 inputs: tf32 tensor cores (FMA pipes where there are none)
    alu_ops_per_clk: float  # fp32 lanes per SM: one element operation per lane per clock
    dram_bytes_per_clk: float  # DRAM bandwidth per SM per clock (all SMs together share sm_count times this)
    l2_bytes_per_clk: float  # what one SM can pull from L2 per clock
    memory_latency_clk: float = 800.0  # a DRAM load's round trip: microbenchmarks of A100/H100 find ~600-1000
    launch_clk: float = 2000.0  # a dependent kernel launch and drain on one stream: ~1 us at ~2 GHz
    # A pipelined main-loop step's fixed cost beyond its math and loads (barrier wait, MMA issue and wait, address
    # and mask arithmetic): what makes many shallow K steps slower than few deep ones. Not a published figure:
    # fitted to the recorded H200 GEMM tables (cache/timings/; 200 and 800 rank those tables' best configs worse),
    # so on those tables the model is judged in-sample.
    loop_step_clk: float = 400.0


# Sources: NVIDIA's whitepapers (peak rate / (SMs x boost clock)).
ARCHS: dict[int, Arch] = {
    # V100: 125 TFLOPS fp16 tensor / (80 SMs x 1.53 GHz) = 1024; no tf32 (fp32 dots run on the FMA pipes: 64 lanes
    # x 2); 900 GB/s HBM2 = 7.4 B/clk/SM; L2 2048 B/clk over 80 SMs.
    7: Arch("sm_70", 1024.0, 128.0, 64.0, 7.4, 25.6),
    # A100: 312 TFLOPS bf16 dense / (108 x 1.41 GHz) = 2048, tf32 half that; 64 fp32 lanes; 2.04 TB/s (80 GB)
    # = 13.4 B/clk/SM; L2 5120 B/clk over 108 SMs = 47.
    8: Arch("sm_80", 2048.0, 1024.0, 64.0, 13.4, 47.0),
    # H100 SXM: 989 TFLOPS bf16 dense / (132 x 1.83 GHz) = 4096, tf32 half that; 128 fp32 lanes; 3.35 TB/s (H100)
    # to 4.8 TB/s (H200) = 14-20 B/clk/SM, we take 16. L2 per SM per clock is not published: we assume 64 (A100's
    # 47 grown with Hopper's larger L2), an assumption that only weighs tile reloads.
    9: Arch("sm_90", 4096.0, 2048.0, 128.0, 16.0, 64.0),
}
DEFAULT_ARCH = ARCHS[9]


def arch_for(compute_capability: str | None) -> Arch:
    """The rates for a compute capability ("9.0"); newer parts use the newest known, unknown ones sm_90's."""
    try:
        major = int(str(compute_capability).split(".")[0])
    except ValueError:
        return DEFAULT_ARCH
    known = [m for m in ARCHS if m <= major]
    return ARCHS[max(known)] if known else DEFAULT_ARCH


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


def _math_rate(arch: Arch, unit: Math) -> float:
    return {"tensor": arch.tensor_flops_per_clk, "tf32": arch.tf32_flops_per_clk, "alu": arch.alu_ops_per_clk}[unit]


def predict_clk(geometry: Geometry, programs_per_sm: int, sm_count: int, arch: Arch) -> float:
    """Modelled time in SM clocks: the sum over waves of each wave's time, plus launches.

    A wave is what the slots (sm_count x programs_per_sm) run at once; its time is the larger of
    - the busiest SM's time: its k co-resident tiles share the SM, so k x max(compute, memory) of one tile, where
      compute is the tile's flops (padding counts as work) at the SM's rate and memory is the tile's bytes at the
      SM's L2 bandwidth, or less when k tiles do not keep enough bytes in flight to cover the memory latency
      (Little's law: bandwidth <= bytes in flight / latency); plus one latency to fill the pipeline;
    - the wave's share of DRAM: its tiles' unique bytes at the whole device's DRAM bandwidth.
    Persistent programs pay the pipeline fill once: the next tile's loads overlap the previous tile's epilogue.
    Their waves of tiles quantize the same way: a program loops over ceil(tiles / programs) tiles.
    """
    tiles = geometry.tiles
    if tiles == 0:
        return arch.launch_clk * (1 + geometry.extra_kernels)
    slots = sm_count * programs_per_sm
    waves = -(-tiles // slots)
    rate = _math_rate(arch, geometry.math)
    dram_bandwidth = arch.dram_bytes_per_clk * sm_count
    dram_per_tile = geometry.dram_bytes / tiles

    def wave_clk(tiles_in_wave: int, fill: bool) -> float:
        resident = -(-tiles_in_wave // sm_count)  # tiles on the busiest SM
        compute = resident * (geometry.flops_per_tile / rate + geometry.loop_steps * arch.loop_step_clk)
        bandwidth = min(arch.l2_bytes_per_clk, resident * geometry.inflight_bytes / arch.memory_latency_clk)
        memory = resident * geometry.tile_bytes / max(bandwidth, 1e-9)
        busiest_sm = max(compute, memory) + (arch.memory_latency_clk if fill else 0.0)
        return max(busiest_sm, tiles_in_wave * dram_per_tile / dram_bandwidth)

    refill = not geometry.persistent
    last = tiles - (waves - 1) * slots
    if waves == 1:
        total = wave_clk(last, fill=True)
    else:
        total = wave_clk(slots, fill=True) + (waves - 2) * wave_clk(slots, refill) + wave_clk(last, refill)
    return total + arch.launch_clk * (1 + geometry.extra_kernels) + geometry.extra_dram_bytes / dram_bandwidth


def ideal_clk(geometry: Geometry, sm_count: int, arch: Arch) -> float:
    """The roofline of the problem itself: useful flops at the device's peak, or its unique bytes at DRAM's."""
    compute = geometry.useful_flops / (_math_rate(arch, geometry.math) * sm_count)
    return max(compute, geometry.dram_bytes / (arch.dram_bytes_per_clk * sm_count))


def estimated_resources(geometry: Geometry) -> Resources:
    return Resources(geometry.threads, geometry.regs_per_thread, geometry.smem_bytes, "estimated")


def compiled_resources(config: Config, n_regs: int, shared_bytes: int, warp_size: int = 32) -> Resources:
    """A compiled kernel's resources (Triton's CompiledKernel n_regs / metadata.shared, or a timing table row's)."""
    return Resources(warp_size * int(config["num_warps"]), int(n_regs), int(shared_bytes), "compiled")


def compiled_from_rows(rows: Iterable[CompiledRow], warp_size: int = 32) -> dict[ConfigId, Resources]:
    """Compiled resources by config_id from timing-table rows that recorded them (rows without are left out)."""
    return {
        config_id(row.config): compiled_resources(row.config, row.n_regs, row.shared_bytes, warp_size)
        for row in rows
        if row.n_regs is not None and row.shared_bytes is not None
    }


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

CompiledTable = Mapping[ConfigId, Resources]  # config_id -> compiled resources (compiled_from_rows)


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
