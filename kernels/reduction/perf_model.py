"""The tile geometry of the reduction kernels (reduction.py) for the quantization model."""

from __future__ import annotations

from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers, space_values, tile_counts
from tunekit.core.space import Config, Problem, SearchSpace
from tunekit.kernels.common import FP32_BYTES, cdiv, element_bytes, next_pow2, pow2_divisor

OPS = {"sum": 1, "mean": 1, "max": 2}  # fp32 operations per element
REGISTERS_PER_ELEMENT = 2  # the accumulator and the loaded value (max: plus an index)
INDEX_BYTES = 4  # max also returns int32 (or int64) indices


def reduction_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    """`inner`: one program per BLOCK_M rows walking cols in BLOCK_N chunks. `outer` / `outer_split`: one program
    per (batch, BLOCK_N columns, split), each walking its run of rows in BLOCK_M chunks; a split adds a combine
    pass over the fp32 partials."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    batch = int(problem.get("batch", 1)) if problem.get("axis") != "inner" else 1
    variant = str(config["variant"])
    block_m, block_n, stages = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["num_stages"])
    e = element_bytes(str(problem["dtype"]))
    op = str(problem.get("op", "sum"))
    index_bytes = INDEX_BYTES if op == "max" else 0
    threads = warp_size * int(config["num_warps"])
    ops = OPS.get(op, 1)
    per_value = REGISTERS_PER_ELEMENT + (1 if op == "max" else 0)
    regs = estimate_registers(block_m * block_n / threads, threads, per_value)
    staged = (stages - 1) * block_m * block_n * e
    useful = float(batch) * rows * cols
    if variant == "inner":
        programs, chunks = cdiv(rows, block_m), cdiv(cols, block_n)
        padded = float(programs) * block_m * chunks * block_n
        return Geometry(
            dims=(TileDim("rows", programs, block_m), TileDim("cols", 1, chunks * block_n)),
            shape=f"{block_m}x{block_n}x{chunks}",
            useful_work=useful,
            padded_work=padded,
            useful_flops=useful * ops,
            flops_per_tile=float(block_m) * chunks * block_n * ops,
            math="alu",
            tile_bytes=(rows * cols * e + rows * (e + index_bytes)) / programs,
            dram_bytes=float(rows) * cols * e + rows * (e + index_bytes),
            inflight_bytes=min(block_m, rows) * min(block_n, cols) * e * max(1, stages - 1),
            threads=threads,
            regs_per_thread=regs,
            smem_bytes=staged,
        )
    split = int(config["SPLIT"]) if variant == "outer_split" else 1
    col_tiles = cdiv(cols, block_n)
    per_split = cdiv(cdiv(rows, split), block_m) * block_m  # kernels/reduction/reduction.py _launch_outer
    programs = batch * col_tiles * split
    out_bytes = FP32_BYTES + index_bytes if split > 1 else e + index_bytes
    outputs = float(batch) * split * cols * out_bytes
    extra_dram = float(batch) * split * cols * (FP32_BYTES + index_bytes) + batch * cols * (e + index_bytes)
    return Geometry(
        dims=(TileDim("batch", batch, 1), TileDim("cols", col_tiles, block_n), TileDim("split", split, per_split)),
        shape=f"{block_m}x{block_n}" + (f"/{split}" if split > 1 else ""),
        useful_work=useful,
        padded_work=float(programs) * per_split * block_n,
        useful_flops=useful * ops,
        flops_per_tile=float(per_split) * block_n * ops,
        math="alu",
        tile_bytes=(useful * e + outputs) / programs,
        dram_bytes=useful * e + outputs,
        inflight_bytes=min(block_m, rows) * min(block_n, cols) * e * max(1, stages - 1),
        threads=threads,
        regs_per_thread=regs,
        smem_bytes=staged,
        extra_kernels=1 if split > 1 else 0,
        extra_dram_bytes=extra_dram if split > 1 else 0.0,
    )


def reduction_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Programs and chunks for every BLOCK_M, BLOCK_N and SPLIT (BLOCK_M = BLOCK_N = 1 pin rows and cols)."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    block_m, splits = space_values(space, "BLOCK_M"), space_values(space, "SPLIT")
    return (
        ("batch", int(problem.get("batch", 1))),
        (
            "rows",
            next_pow2(rows),
            tile_counts(rows, block_m),
            tuple(tile_counts(cdiv(rows, s), block_m) for s in splits),
        ),
        ("cols", next_pow2(cols), tile_counts(cols, space_values(space, "BLOCK_N")), pow2_divisor(cols)),
    )


MODEL = KernelModel(
    reduction_geometry, ("batch", "rows", "cols"), reduction_size_classes, ("variant", "BLOCK_M", "BLOCK_N", "SPLIT")
)
