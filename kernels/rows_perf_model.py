"""The tile geometry of the row kernels for the quantization model (tunekit.tuning.perf_model,
tunekit/core/geometry.py).

Forward (LayerNorm, RMSNorm, softmax): `single` / `window` have one program per ROWS rows holding [ROWS, BLOCK_N];
the looped variants one program per row walking it in ceil(cols / BLOCK_N) chunks. Backward (LayerNorm, RMSNorm):
a persistent grid of PROGRAMS_PER_SM programs per SM over row tiles, each writing one partial dweight (and dbias)
row that a second kernel sums. Each kernel's declaration builds its model here from what differs: arithmetic per
element, reads of x per variant, and the [N] parameter vectors its programs read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers, space_values, tile_counts
from tunekit.core.space import Config, Problem, SearchSpace
from tunekit.kernels.common import FP32_BYTES, cdiv, element_bytes, next_pow2, pow2_divisor
from tunekit.search_spaces.rows import HOLDS_ROWS

# Registers per element of a program's register tile (each element also needs its fp32 temporaries).
REGISTERS_PER_ELEMENT = {"single": 3, "looped": 4}  # looped lanes carry Welford's mean and M2 besides x
# Measured with ptxas for sm_90 (search_spaces/norms/layernorm_backward.py): ~24 + 7 per element.
BACKWARD_REGISTERS_PER_ELEMENT = 7
BACKWARD_OPS = 20  # fp32 operations per element of a norm backward, all passes together
WORKSPACE_SMS = 132  # the SM count backward_model costs the partial-sum workspace for (see there)

ParamsRead = Callable[[Problem], int]


def norm_params(problem: Problem) -> int:
    """Parameter vectors ([N] weight, bias) every program of a norm reads (L2 hits after the first)."""
    return int(bool(problem.get("weight", False))) + int(bool(problem.get("bias", False)))


def row_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Programs along rows for every ROWS (ROWS = 1 pins rows exactly), chunks along cols for
    every BLOCK_N, the single variant's block width (next_pow2) and the alignment of cols."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    row_blocks = space_values(space, "ROWS")
    return (
        ("rows", tile_counts(rows, row_blocks or (1,))),
        ("cols", next_pow2(cols), tile_counts(cols, space_values(space, "BLOCK_N")), pow2_divisor(cols)),
    )


def _row_work(rows: int, cols: int, programs: int, per_program: int, row_extent: int, ops: int) -> dict[str, Any]:
    """The geometry every row kernel shares: programs along the rows, each owning `per_program` of them and
    walking `row_extent` columns (padding included) with `ops` fp32 operations per element."""
    return {
        "dims": (TileDim("rows", programs, per_program), TileDim("cols", 1, row_extent)),
        "useful_work": float(rows) * cols,
        "padded_work": float(programs) * per_program * row_extent,
        "useful_flops": float(rows) * cols * ops,
        "flops_per_tile": float(per_program) * row_extent * ops,
        "math": "alu",
    }


def forward_model(ops: int, looped_reads: Mapping[str, int], params: ParamsRead) -> KernelModel:
    """A row forward kernel: `ops` fp32 operations per element (an estimate from the kernel's body: memory bounds
    these kernels, arithmetic only matters where padding leaves programs mostly masked off), reads of x per row
    of each looped variant (the row-holding ones read it once), and the parameter vectors it reads."""

    def geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
        rows, cols = int(problem["rows"]), int(problem["cols"])
        variant = str(config["variant"])
        block_n, stages, warps = int(config["BLOCK_N"]), int(config["num_stages"]), int(config["num_warps"])
        e = element_bytes(str(problem["dtype"]))
        threads = warp_size * warps
        holds = variant in HOLDS_ROWS
        rows_per_program, chunks = (int(config["ROWS"]), 1) if holds else (1, cdiv(cols, block_n))
        programs = cdiv(rows, rows_per_program)
        row_extent = chunks * block_n
        avg_rows = rows / programs
        passes = 1 if holds else looped_reads[variant]
        vectors = params(problem)
        if holds:
            held = rows_per_program * block_n
            inflight = avg_rows * cols * e  # a program issues all its loads before the first reduction
        else:
            held = block_n
            inflight = block_n * e * max(1, stages - 1)
        staged = 0 if holds else (stages - 1) * block_n * e  # search_spaces/rows.py: one chunk per stage
        scratch = rows_per_program * warps * FP32_BYTES * 2  # cross-warp partial sums
        per_value = REGISTERS_PER_ELEMENT["single" if holds else "looped"]
        return Geometry(
            **_row_work(rows, cols, programs, rows_per_program, row_extent, ops),
            shape=f"{rows_per_program}x{block_n}" + ("" if holds else f"x{chunks}"),
            tile_bytes=avg_rows * cols * e * (passes + 1) + vectors * cols * e,
            dram_bytes=float(rows) * cols * e * 2 + vectors * cols * e,
            inflight_bytes=inflight,
            threads=threads,
            regs_per_thread=estimate_registers(held / threads, threads, per_value),
            smem_bytes=staged + (scratch if warps > 1 else 0),
        )

    return KernelModel(geometry, ("rows", "cols"), row_size_classes, ("variant", "BLOCK_N", "ROWS"))


def backward_model(partials: ParamsRead) -> KernelModel:
    """A norm backward: `partials` is the count of gradient vectors (dweight, dbias) summed over rows. A persistent
    grid of at most PROGRAMS_PER_SM programs per SM strides over the row tiles (`single`: [ROWS, BLOCK_N] tiles of
    whole rows; `looped`: one row in BLOCK_N chunks, twice, updating its partial row chunk by chunk), and each
    program writes one partial row that a second kernel sums. Shape: ROWSxBLOCK_N[xchunks]@PROGRAMS_PER_SM.

    The geometry sees no SM count (the launch takes it from the device): the workspace is costed for
    PROGRAMS_PER_SM × WORKSPACE_SMS rows, the 132-SM Hopper the heuristic targets; it is small beside the rows."""

    def geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
        rows, cols = int(problem["rows"]), int(problem["cols"])
        block_n, stages, warps = int(config["BLOCK_N"]), int(config["num_stages"]), int(config["num_warps"])
        per_sm = int(config["PROGRAMS_PER_SM"])
        e = element_bytes(str(problem["dtype"]))
        threads = warp_size * warps
        sums = partials(problem)
        single = config["variant"] == "single"
        tile_rows, chunks = (int(config["ROWS"]), 1) if single else (1, cdiv(cols, block_n))
        tiles = cdiv(rows, tile_rows)
        programs = min(tiles, per_sm * WORKSPACE_SMS)
        tile_cols = float(tile_rows * cols)
        if single:
            inflight = 2.0 * tile_cols * e  # x and dy of one tile
            row_bytes = tile_cols * e * 3  # x, dy in; dx out
            partial_bytes = 0.0  # in registers; one row per program, written once (extra_dram_bytes)
        else:
            inflight = 2.0 * block_n * e * max(1, stages - 1)
            row_bytes = tile_cols * e * 5  # x, dy twice; dx out
            partial_bytes = tile_cols * sums * FP32_BYTES * 2  # read-modify-write per row
        workspace = float(programs) * cols * FP32_BYTES * sums
        weight_bytes = int(bool(problem.get("weight", False))) * cols * e
        return Geometry(
            **_row_work(rows, cols, tiles, tile_rows, chunks * block_n, BACKWARD_OPS),
            shape=f"{tile_rows}x{block_n}" + ("" if single else f"x{chunks}") + f"@{per_sm}",
            tile_bytes=row_bytes + partial_bytes + weight_bytes,  # the weight is re-read per tile (L1/L2 hits)
            dram_bytes=float(rows) * cols * e * 3 + workspace + weight_bytes,
            inflight_bytes=inflight,
            threads=threads,
            regs_per_thread=estimate_registers(tile_rows * block_n / threads, threads, BACKWARD_REGISTERS_PER_ELEMENT),
            smem_bytes=tile_rows * warps * FP32_BYTES * 4 if warps > 1 else 0,
            persistent=True,
            max_programs_per_sm=per_sm,
            extra_kernels=1 if sums else 0,
            extra_dram_bytes=workspace + sums * cols * e,
        )

    return KernelModel(geometry, ("rows", "cols"), row_size_classes, ("variant", "BLOCK_N", "ROWS", "PROGRAMS_PER_SM"))
