"""The GEMM's tile geometry for the quantization model (tunekit.tuning.perf_model, tunekit/core/geometry.py): the
grid of each variant as kernels/gemm/host.py launches it."""

from __future__ import annotations

from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers, space_values, tile_counts
from tunekit.core.space import Config, Problem, SearchSpace
from tunekit.kernels.common import FP32_BYTES, VECTOR_BYTES, cdiv, element_bytes, next_pow2, pow2_divisor

# GEMM operand fragments: tensor-core instructions take k-slices 16 deep (mma.m16n8k16 / wgmma k16 for 2-byte
# types); we count one slice of A and of B, double-buffered, spread over the threads.
MMA_K = 16
# The persistent variants launch min(tiles, #SMs) programs (kernels/gemm/host.py, _num_programs): one per SM.
PERSISTENT_PROGRAMS_PER_SM = 1


def gemm_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    """One program per BLOCK_M x BLOCK_N tile of C (times SPLIT_K for splitk); persistent variants loop over tiles.

    Every tile runs whole BLOCK_K steps on the tensor cores, the ragged K step and masked-off rows and columns
    included. Loads are clipped to the problem (masked lanes and TMA's out-of-bounds boxes fetch nothing). staged
    is tma's tiles plus the copies of its unaligned operands, as extra kernels and bytes. Not modelled: that plain
    loads of rows with no 16-byte alignment go element by element (what makes staged worth its copies).
    """
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    variant = str(config["variant"])
    split = int(config["SPLIT_K"]) if variant == "splitk" else 1
    stages = int(config["num_stages"])
    e = element_bytes(str(problem["dtype"]))
    threads = warp_size * int(config["num_warps"])
    tiles_m, tiles_n = cdiv(m, bm), cdiv(n, bn)
    k_steps = cdiv(k, bk)
    steps_per_split = cdiv(k_steps, split)  # kernels/gemm/host.py: k_per_split = cdiv(cdiv(K, BK), SPLIT_K) * BK
    dims = [TileDim("m", tiles_m, bm), TileDim("n", tiles_n, bn)]
    if split > 1:
        dims.append(TileDim("k", split, steps_per_split * bk))
    tiles = tiles_m * tiles_n * split
    residual = bool(problem.get("has_residual", False))
    bias = bool(problem.get("has_bias", False))
    # Every (m, n) tile reads its A rows and B columns over all of K, whatever the split: summed over the tiles
    # that is A once per column of tiles and B once per row of tiles.
    operand_loads = e * (m * k * tiles_n + k * n * tiles_m)
    out_bytes = FP32_BYTES if split > 1 else e  # splitk writes fp32 partial tiles to its workspace
    epilogue_loads = (e * m * n if residual else 0) + (e * n * tiles_m if bias and split == 1 else 0)
    tile_bytes = (operand_loads + out_bytes * m * n * split + (epilogue_loads if split == 1 else 0)) / tiles
    dram = e * (m * k + k * n) + out_bytes * m * n * split
    if split == 1:
        dram += (e * m * n if residual else 0) + (e * n if bias else 0)
    extra_kernels, extra_dram = 0, 0.0
    if split > 1:  # the reduce kernel reads the partials, applies the epilogue and writes C
        extra_kernels = 1
        extra_dram = FP32_BYTES * split * m * n + e * m * n + (e * m * n if residual else 0) + (e * n if bias else 0)
    if variant == "staged":
        extra_kernels, extra_dram = _staging_copies(problem, e)
    # Registers: the fp32 accumulator (BM*BN values over the threads), one double-buffered 16-deep k-slice of the
    # A and B operands in 32-bit registers, and BASE_REGISTERS for addresses, masks and loop state; capped at 255.
    accumulator = bm * bn / threads
    fragments = 2 * (bm + bn) * MMA_K * e / FP32_BYTES / threads
    pipeline_smem = stages * (bm * bk + bk * bn) * e  # as search_spaces/gemm/gemm.py smem_bytes
    # Triton reuses the pipeline buffers (dead after the K loop) for the epilogue's layout conversion.
    epilogue_smem = bm * bn * out_bytes
    persistent = variant in ("persistent", "tma", "staged")
    return Geometry(
        dims=tuple(dims),
        shape=f"{bm}x{bn}x{bk}" + (f"/{split}" if split > 1 else ""),
        useful_work=float(m) * n * k,
        padded_work=float(tiles_m * bm) * (tiles_n * bn) * (k_steps * bk),
        useful_flops=2.0 * m * n * k,
        flops_per_tile=2.0 * bm * bn * steps_per_split * bk,
        math="tf32" if e == FP32_BYTES else "tensor",
        tile_bytes=tile_bytes,
        dram_bytes=dram,
        inflight_bytes=max(1, stages - 1) * (min(bm, m) * bk + bk * min(bn, n)) * e,
        threads=threads,
        regs_per_thread=estimate_registers(accumulator + fragments, threads),
        smem_bytes=max(pipeline_smem, epilogue_smem),
        persistent=persistent,
        max_programs_per_sm=PERSISTENT_PROGRAMS_PER_SM if persistent else None,
        extra_kernels=extra_kernels,
        extra_dram_bytes=extra_dram,
        loop_steps=steps_per_split,
    )


def _staging_copies(problem: Problem, e: int) -> tuple[int, float]:
    """The staged variant's copies (kernels/gemm/host.py `_staged`): one copy kernel per operand whose leading dim is
    no multiple of 16 bytes, reading it once and writing it with that dim padded; the tma kernel then reads the
    copy (its operand bytes, counted as for tma)."""
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    a_col, b_col = problem.get("a_layout") == "col", problem.get("b_layout") == "col"
    per_vector = VECTOR_BYTES // e
    copies, moved = 0, 0.0
    for rows, lead in ((k, m) if a_col else (m, k), (n, k) if b_col else (k, n)):  # (rows, leading dim) of A, B
        if lead % per_vector:
            copies += 1
            moved += e * rows * (lead + cdiv(lead, per_vector) * per_vector)
    return copies, moved


def gemm_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Tiles along M and N for every BLOCK_M / BLOCK_N, K steps and K evenness for every BLOCK_K, the bounds the
    space's block rules read (next_pow2), and the alignment the kernel specialises on."""
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    block_k = space_values(space, "BLOCK_K")
    col_major_a = problem.get("a_layout") == "col"
    return (
        ("m", next_pow2(m), tile_counts(m, space_values(space, "BLOCK_M")), pow2_divisor(m) if col_major_a else 0),
        ("n", next_pow2(n), tile_counts(n, space_values(space, "BLOCK_N")), pow2_divisor(n)),
        ("k", next_pow2(k), tile_counts(k, block_k), tuple(k % b == 0 for b in block_k), pow2_divisor(k)),
    )


MODEL = KernelModel(gemm_geometry, ("m", "n", "k"), gemm_size_classes, ("variant", "BLOCK_M", "BLOCK_N"))
