"""The tile geometry of the fused SwiGLU kernel (kernels/glu/swiglu.py) for the quantization model: one program
per [ROWS, BLOCK_N] tile of the [M, N] rows, a grid of row blocks x column blocks (pointwise's `rows` layout with
two input streams and no bias). The size classes are the row kernels' (kernels/rows_perf_model.py)."""

from __future__ import annotations

from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers
from tunekit.core.space import Config, Problem
from tunekit.kernels.common import cdiv, element_bytes
from tunekit.kernels.rows_perf_model import row_size_classes

# fp32 operations per element: two conversions, silu as |g|, exp, add, select and divide, two multiplies.
OPS_PER_ELEMENT = 10
REGISTERS_PER_ELEMENT = 3  # gate, up and the fp32 result
STREAMS = 3  # gate and up read, y written


def swiglu_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    block_n, tile_rows = int(config["BLOCK_N"]), int(config["ROWS"])
    e = element_bytes(str(problem["dtype"]))
    threads = warp_size * int(config["num_warps"])
    row_tiles, col_tiles = cdiv(rows, tile_rows), cdiv(cols, block_n)
    programs = row_tiles * col_tiles
    tile = tile_rows * block_n
    useful = float(rows) * cols
    per_program = useful / programs
    return Geometry(
        dims=(TileDim("rows", row_tiles, tile_rows), TileDim("cols", col_tiles, block_n)),
        shape=f"{tile_rows}x{block_n}",
        useful_work=useful,
        padded_work=float(programs) * tile,
        useful_flops=useful * OPS_PER_ELEMENT,
        flops_per_tile=float(tile) * OPS_PER_ELEMENT,
        math="alu",
        tile_bytes=per_program * e * STREAMS,
        dram_bytes=useful * e * STREAMS,
        inflight_bytes=per_program * e * 2,  # both loads are issued before the first multiply
        threads=threads,
        regs_per_thread=estimate_registers(tile / threads, threads, REGISTERS_PER_ELEMENT),
        smem_bytes=0,
    )


MODEL = KernelModel(swiglu_geometry, ("rows", "cols"), row_size_classes, ("BLOCK_N", "ROWS"))
