"""The roofline side of the quantization model (tunekit.tuning.perf_model): each GPU generation's per-SM rates and a
geometry's modelled time in SM clocks against them (`predict_clk`), next to the problem's own roofline (`ideal_clk`).

Rates are NVIDIA's (sm_70 onwards; each with its source below). Times are in SM clocks and only their ratios matter.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunekit.core.geometry import Geometry, Math


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
