"""The tile geometry of the fused pointwise kernel (kernels/pointwise/pointwise.py) for the quantization model.

`flat`: one program per BLOCK contiguous elements. `rows`: one per [BLOCK // BLOCK_N, BLOCK_N] tile of x viewed as
[numel // N, N], the bias loaded once per tile.
"""

from __future__ import annotations

from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers, space_values, tile_counts
from tunekit.core.space import Config, Problem, SearchSpace
from tunekit.kernels.common import cdiv, element_bytes, next_pow2, pow2_divisor

# fp32 operations per element: scale and cast (2) plus the activation; erf/tanh/exp cost several instructions each.
ACTIVATION_OPS = {"none": 0, "relu": 1, "gelu": 20, "gelu_tanh": 15, "silu": 10, "sigmoid": 8, "tanh": 10}
FLAT_BIAS_MODULO_OPS = 8  # flat's bias column i % N: an integer modulo is a multi-instruction sequence
REGISTERS_PER_ELEMENT = 3


def _rows_view(problem: Problem) -> tuple[int, int]:
    """[M, N] as the launch sees x: N is the bias length (all of x when there is none), M = numel // N."""
    numel, cols = int(problem["numel"]), int(problem["cols"])
    n = cols if cols > 0 else max(1, numel)
    return max(1, numel // n), n


def pointwise_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    numel = int(problem["numel"])
    block = int(config["BLOCK"])
    e = element_bytes(str(problem["dtype"]))
    threads = warp_size * int(config["num_warps"])
    residual = bool(problem.get("has_residual", False))
    bias = bool(problem.get("has_bias", False))
    streams = 2 + int(residual)  # x in, y out, residual in
    ops = 2 + ACTIVATION_OPS.get(str(problem.get("activation", "none")), 10) + int(bias) + int(residual)
    if config["variant"] == "rows":
        m, n = _rows_view(problem)
        block_n = int(config["BLOCK_N"])
        block_m = max(1, block // block_n)
        grid_m, col_tiles = cdiv(m, block_m), cdiv(n, block_n)
        programs = grid_m * col_tiles
        dims: tuple[TileDim, ...] = (TileDim("rows", grid_m, block_m), TileDim("cols", col_tiles, block_n))
        useful = float(m) * n
        bias_bytes = float(block_n) * e if bias else 0.0
        shape = f"{block_m}x{block_n}"
    else:
        programs = cdiv(numel, block)
        dims = (TileDim("elements", programs, block),)
        useful = float(numel)
        bias_bytes = useful / programs * e if bias else 0.0  # gathered per element (cache hits)
        ops += FLAT_BIAS_MODULO_OPS if bias else 0
        shape = f"{block}"
    avg = useful / programs
    return Geometry(
        dims=dims,
        shape=shape,
        useful_work=useful,
        padded_work=float(programs) * block,
        useful_flops=useful * ops,
        flops_per_tile=float(block) * ops,
        math="alu",
        tile_bytes=avg * e * streams + bias_bytes,
        dram_bytes=useful * e * streams + (int(problem["cols"]) * e if bias else 0),
        inflight_bytes=avg * e * (1 + int(residual)),
        threads=threads,
        regs_per_thread=estimate_registers(block / threads, threads, REGISTERS_PER_ELEMENT),
        smem_bytes=0,
    )


def pointwise_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Programs for every BLOCK (flat) and every BLOCK // BLOCK_N x BLOCK_N tile (rows)."""
    numel = int(problem["numel"])
    m, n = _rows_view(problem)
    blocks, block_ns = space_values(space, "BLOCK"), space_values(space, "BLOCK_N")
    tile_rows = tuple(sorted({max(1, b // bn) for b in blocks for bn in block_ns}))
    return (
        ("numel", next_pow2(numel), tile_counts(numel, blocks)),
        ("rows", next_pow2(m), tile_counts(m, tile_rows)),
        ("cols", next_pow2(n), tile_counts(n, block_ns), pow2_divisor(n)),
    )


MODEL = KernelModel(pointwise_geometry, ("numel", "cols"), pointwise_size_classes, ("variant", "BLOCK", "BLOCK_N"))
