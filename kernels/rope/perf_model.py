"""The tile geometry of the rotary embedding kernels (kernels/rope/rope.py, forward and backward) for the quantization
model: one program per [BLOCK_R rows, BLOCK_H heads] tile of q and of k (the whole head dim), cos and sin loaded
once per program."""

from __future__ import annotations

from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers, space_values, tile_counts
from tunekit.core.space import Config, Problem, SearchSpace
from tunekit.kernels.common import cdiv, element_bytes, next_pow2
from tunekit.search_spaces.rope.rope import half_block, max_heads

OPS_PER_ELEMENT = 4  # two loads' conversions, two multiplies and an add per output element, in fp32
REGISTERS_PER_ELEMENT = 3  # x, the other half and the fp32 result


def rope_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    rows, dim = int(problem["rows"]), int(problem["head_dim"])
    q_heads, k_heads = int(problem["q_heads"]), int(problem["k_heads"])
    block_r, block_h = int(config["BLOCK_R"]), int(config["BLOCK_H"])
    width = 2 * half_block(problem)
    e = element_bytes(str(problem["dtype"]))
    threads = warp_size * int(config["num_warps"])
    row_tiles, head_tiles = cdiv(rows, block_r), cdiv(max_heads(problem), block_h)
    useful = float(rows) * (q_heads + k_heads) * dim
    programs = row_tiles * head_tiles
    cos_sin = 2.0 * rows * dim * e  # read once per row by every head tile: L2 serves the repeats
    tile = block_r * block_h * width
    return Geometry(
        dims=(TileDim("rows", row_tiles, block_r), TileDim("heads", head_tiles, block_h)),
        shape=f"{block_r}x{block_h}x{width}",
        useful_work=useful,
        padded_work=float(programs) * 2 * tile,
        useful_flops=useful * OPS_PER_ELEMENT,
        flops_per_tile=2.0 * tile * OPS_PER_ELEMENT,
        math="alu",
        tile_bytes=(2 * useful * e + cos_sin * head_tiles) / programs,
        dram_bytes=2 * useful * e + cos_sin,
        inflight_bytes=float(tile) * e,  # one tensor's tile: q's loads complete before k's are issued
        threads=threads,
        regs_per_thread=estimate_registers(tile / threads, threads, REGISTERS_PER_ELEMENT),
        smem_bytes=0,
    )


def rope_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Programs along rows for every BLOCK_R, along heads for every BLOCK_H, and the head dim's padding."""
    rows, dim = int(problem["rows"]), int(problem["head_dim"])
    return (
        ("rows", next_pow2(rows), tile_counts(rows, space_values(space, "BLOCK_R"))),
        ("q_heads", tile_counts(int(problem["q_heads"]), space_values(space, "BLOCK_H"))),
        ("k_heads", tile_counts(int(problem["k_heads"]), space_values(space, "BLOCK_H"))),
        ("head_dim", dim, 2 * half_block(problem)),
    )


MODEL = KernelModel(
    rope_geometry, ("rows", "q_heads", "k_heads", "head_dim"), rope_size_classes, ("BLOCK_R", "BLOCK_H")
)
