"""The tile geometry a kernel declares for the quantization model (tunekit.tuning.perf_model): the contract and its
helpers.

A kernel's declaration may carry a `KernelModel` (`KernelSpec.model`): how one config of the kernel decomposes
one problem into programs (tiles). Its `geometry` maps (config, problem, warp size) to a `Geometry`: programs along
each dimension and each program's padded extent, useful against padded work, the threads of a program and its
estimated registers and shared memory, its flops and the bytes it moves. `tunekit.tuning.perf_model` turns that into
occupancy, waves and a modelled time; nothing here knows the device. Each kernel's geometry lives next to the
kernel (kernels/rows_perf_model.py, kernels/<family>/perf_model.py): the grids follow its launch.

Register and shared-memory figures are estimates made before compiling (the model takes the compiled kernel's
where known). Registers: a fixed part for addresses, offsets, masks and loop state, plus what the program's
register tile holds per thread; rounded up to the allocation unit of 8 per thread and capped where ptxas caps
them (255, and what lets one block launch: it spills instead).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from tunekit.core.occupancy import MAX_REGISTERS_PER_THREAD, REGISTER_ALLOCATION_UNIT
from tunekit.core.space import Config, Problem, SearchSpace

Math = Literal["tensor", "tf32", "alu"]

# Addresses, offsets, masks and loop state: what a Triton program holds besides its tiles (ptxas reports 20-40
# registers for the kernels here with the smallest tiles).
BASE_REGISTERS = 24
REGISTER_FILE = 65536  # registers one block may use, on every NVIDIA part since sm_50: ptxas spills beyond it
REGISTER_UNIT_PER_THREAD = REGISTER_ALLOCATION_UNIT // 32  # 256 registers per 32-thread warp: 8 per thread


class TileDim(NamedTuple):
    """Programs along one dimension of the problem, and each program's padded extent along it."""

    name: str
    tiles: int
    extent: int


@dataclass(frozen=True)
class Geometry:
    """The work decomposition of one config on one problem: what the generic model quantizes."""

    dims: tuple[TileDim, ...]
    shape: str  # the tile, readable (e.g. 128x256x64 for a GEMM tile with BLOCK_K)
    useful_work: float  # elements (or multiply-adds) the problem needs
    padded_work: float  # what the programs do, masked-off padding included
    useful_flops: float
    flops_per_tile: float  # of the largest program, padding included
    math: Math  # which unit does the flops
    tile_bytes: float  # bytes an average program moves between L2 and its SM
    dram_bytes: float  # bytes the launch must move to or from DRAM (unique data; L2 serves the reuse)
    inflight_bytes: float  # bytes one program keeps in flight (pipelined loads): what Little's law sees
    threads: int
    regs_per_thread: int  # estimated
    smem_bytes: int  # estimated
    persistent: bool = False  # programs loop over tiles instead of one program per tile
    max_programs_per_sm: int | None = None  # a cap the launch itself puts on resident programs per SM
    extra_kernels: int = 0  # further launches (split-K reduction, partial sums)
    extra_dram_bytes: float = 0.0  # what those launches move
    loop_steps: int = 0  # dependent main-loop iterations per tile (GEMM: K steps), each paying a fixed cost

    @property
    def tiles(self) -> int:
        """Work units: the programs a non-persistent launch would have."""
        count = 1
        for dim in self.dims:
            count *= dim.tiles
        return count

    @property
    def padded_waste(self) -> float:
        """1 - useful work / padded work: the share of the programs' work that is padding."""
        return 0.0 if self.padded_work <= 0 else max(0.0, 1.0 - self.useful_work / self.padded_work)


GeometryFn = Callable[[Config, Problem, int], Geometry]
SizeClassesFn = Callable[[Problem, SearchSpace], tuple[object, ...]]


@dataclass(frozen=True)
class KernelModel:
    """What the model knows about one kernel family (a kernel declares it as `KernelSpec.model`)."""

    geometry: GeometryFn  # (config, problem, warp_size) -> Geometry
    size_fields: tuple[str, ...]  # problem fields that are sizes; every other field is copied into signatures
    size_classes: SizeClassesFn  # what of the sizes the quantization sees, for every tile size in the space
    family: tuple[str, ...]  # parameters that fix the grid (explain groups configs by them, seeds spread over them)


def estimate_registers(per_thread_values: float, threads: int, per_value: float = 1.0) -> int:
    """BASE_REGISTERS + per_value * values held per thread, rounded up to 8, capped where ptxas caps it."""
    wanted = BASE_REGISTERS + per_value * per_thread_values
    rounded = -(-int(wanted + 0.999) // REGISTER_UNIT_PER_THREAD) * REGISTER_UNIT_PER_THREAD
    fits_block = REGISTER_FILE // max(1, threads) // REGISTER_UNIT_PER_THREAD * REGISTER_UNIT_PER_THREAD
    return max(REGISTER_UNIT_PER_THREAD, min(rounded, MAX_REGISTERS_PER_THREAD, fits_block))


def space_values(space: SearchSpace, name: str) -> tuple[int, ...]:
    """The integer values of a parameter of the space ((): the space has no such parameter)."""
    for param in space.params:
        if param.name == name:
            return tuple(int(v) for v in param.values)
    return ()


def tile_counts(size: int, blocks: tuple[int, ...]) -> tuple[int, ...]:
    """Tiles along a size of `size` for each block width."""
    return tuple(-(-size // b) for b in blocks)
