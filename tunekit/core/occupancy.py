"""Occupancy on NVIDIA SMs (sm_70 onwards): how many blocks of a config an SM holds, and what bounds them.

As the CUDA occupancy calculator (cuda_occupancy.h) models it: registers, shared memory, threads and the SM's
block slots, each with its allocation granularity. The quantization model (tunekit.tuning.perf_model) builds on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunekit.core.device_limits import DeviceLimits

# --------------------------------------------------------------------------------------------- architecture facts
# How NVIDIA SMs (sm_70 onwards) hand out resources, as the CUDA occupancy calculator (cuda_occupancy.h) models it.
# Registers go to warps in units of 256 (so a thread's count rounds up to a multiple of 8 in a 32-thread warp);
# the register file is split among 4 sub-partitions (processing blocks), each warp taking its registers from one.
REGISTER_ALLOCATION_UNIT = 256
SUBPARTITIONS_PER_SM = 4
MAX_REGISTERS_PER_THREAD = 255
# The hardware's launch check counts a block's warps rounded up to a multiple of the 4 sub-partitions. A block may
# use 64Ki registers on every part since sm_50, as many as an SM holds: DeviceLimits.regs_per_sm bounds both.
MAX_THREADS_PER_BLOCK = 1024  # every NVIDIA part since sm_20
# Shared memory is allocated in 128-byte units (sm_80+; 256 on sm_7x), and from sm_80 the driver reserves 1 KiB
# per block for itself (cudaDevAttrReservedSharedMemoryPerBlock) on top of what the kernel asks for.
SMEM_ALLOCATION_UNIT = 128
RESERVED_SMEM_PER_BLOCK = 1024

Limiter = Literal["threads", "blocks", "shared_memory", "registers"]
# The order a tie between bounds is reported in: what the block size alone fixes first (using fewer registers or
# less shared memory would not lift it), then shared memory, then registers.
_LIMITER_ORDER: tuple[Limiter, ...] = ("threads", "blocks", "shared_memory", "registers")


@dataclass(frozen=True)
class Resources:
    """What one block of a config holds on an SM."""

    threads: int
    regs_per_thread: int
    smem_bytes: int
    source: Literal["estimated", "compiled"] = "estimated"  # from the config, or from the compiled kernel


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limiter: Limiter  # the bound that binds (the first of _LIMITER_ORDER on a tie)
    bounds: tuple[tuple[Limiter, int], ...]  # blocks per SM each resource alone allows
    why_not: str = ""  # why a block cannot launch at all (blocks_per_sm == 0)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(resources: Resources, limits: DeviceLimits) -> Occupancy:
    """Resident blocks per SM: the tightest of registers, shared memory, threads and the SM's block slots.

    A limit of 0 in `limits` means unknown and bounds nothing.
    """
    warp = max(1, limits.warp_size)
    warps = -(-max(1, resources.threads) // warp)
    bounds: dict[Limiter, int] = {}
    why: dict[Limiter, str] = {}
    unbounded = 1 << 30

    threads = warps * warp
    if resources.threads > MAX_THREADS_PER_BLOCK or (limits.max_threads_per_sm and threads > limits.max_threads_per_sm):
        bounds["threads"] = 0
        why["threads"] = f"{resources.threads} threads > {MAX_THREADS_PER_BLOCK} per block"
    else:
        bounds["threads"] = limits.max_threads_per_sm // threads if limits.max_threads_per_sm else unbounded

    regs_per_warp = _round_up(resources.regs_per_thread * warp, REGISTER_ALLOCATION_UNIT)
    launch_regs = regs_per_warp * _round_up(warps, SUBPARTITIONS_PER_SM)
    if resources.regs_per_thread > MAX_REGISTERS_PER_THREAD or (
        limits.regs_per_sm and launch_regs > limits.regs_per_sm
    ):
        bounds["registers"] = 0
        why["registers"] = (
            f"{resources.regs_per_thread} registers x {resources.threads} threads > {limits.regs_per_sm} per block"
        )
    elif limits.regs_per_sm and regs_per_warp:
        warps_per_subpartition = limits.regs_per_sm // SUBPARTITIONS_PER_SM // regs_per_warp
        bounds["registers"] = warps_per_subpartition * SUBPARTITIONS_PER_SM // warps
    else:
        bounds["registers"] = unbounded

    if limits.smem_per_block and resources.smem_bytes > limits.smem_per_block:
        bounds["shared_memory"] = 0
        why["shared_memory"] = (
            f"{resources.smem_bytes / 1024:.1f} KiB shared > {limits.smem_per_block / 1024:.1f} KiB per block"
        )
    elif limits.smem_per_sm:
        allocated = _round_up(resources.smem_bytes + RESERVED_SMEM_PER_BLOCK, SMEM_ALLOCATION_UNIT)
        bounds["shared_memory"] = limits.smem_per_sm // allocated
    else:
        bounds["shared_memory"] = unbounded

    bounds["blocks"] = limits.max_blocks_per_sm or unbounded
    blocks = min(bounds.values())
    limiter = next(name for name in _LIMITER_ORDER if bounds[name] == blocks)
    ordered = tuple((name, bounds[name]) for name in _LIMITER_ORDER)
    return Occupancy(blocks, limiter, ordered, why.get(limiter, "") if blocks == 0 else "")
