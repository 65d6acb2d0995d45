"""Per-kernel tile geometry: how one config of a kernel decomposes one problem into programs (tiles).

Each kernel family maps (config, problem) to a `Geometry`: programs along each dimension and each program's padded
extent, useful against padded work, the threads of a program and its estimated registers and shared memory, its
flops and the bytes it moves. `tunekit.model` turns that into occupancy, waves and a modelled time; nothing here
knows the device.

The grids follow the launch functions in kernels/*.py. They live here rather than in kernels/ or search_spaces/
on purpose: the shipped cache is keyed by a hash of each kernel's and space's source, so editing those modules
would retire every shipped entry of the kernel.

Register and shared-memory figures are estimates made before compiling (the model takes the compiled kernel's
where known). Registers: a fixed part for addresses, offsets, masks and loop state, plus what the program's
register tile holds per thread; rounded up to the allocation unit of 8 per thread and capped where ptxas caps
them (255, and what lets one block launch: it spills instead).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from tunekit.search_spaces.gemm import ALIGN_BYTES
from tunekit.search_spaces.layernorm import HOLDS_ROWS
from tunekit.space import Config, Problem, SearchSpace

Math = Literal["tensor", "tf32", "alu"]

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
FP32_BYTES = 4
# Addresses, offsets, masks and loop state: what a Triton program holds besides its tiles (ptxas reports 20-40
# registers for the kernels here with the smallest tiles).
BASE_REGISTERS = 24
MAX_REGISTERS_PER_THREAD = 255  # the ISA's limit per thread
REGISTER_FILE = 65536  # registers one block may use, on every NVIDIA part since sm_50: ptxas spills beyond it
REGISTER_UNIT_PER_THREAD = 8  # registers are allocated in units of 256 per 32-thread warp: 8 per thread
# GEMM operand fragments: tensor-core instructions take k-slices 16 deep (mma.m16n8k16 / wgmma k16 for 2-byte
# types); we count one slice of A and of B, double-buffered, spread over the threads.
MMA_K = 16
# Largest power of two the kernels' alignment hints use (DIV / ALIGN in kernels/*.py): 16 elements.
MAX_ALIGN = 16
# The persistent GEMM variants launch min(tiles, #SMs) programs (kernels/gemm.py, _num_programs): one per SM.
PERSISTENT_PROGRAMS_PER_SM = 1

# Arithmetic per element (fp32 ALU operations, all passes together), an estimate from the kernels' bodies. Memory
# bounds these kernels; these only matter where padding makes a program mostly masked-off lanes.
NORM_OPS = {"layernorm": 10, "rmsnorm": 7, "softmax": 8}
NORM_BACKWARD_OPS = 20
REDUCTION_OPS = {"sum": 1, "mean": 1, "max": 2}
# Pointwise: scale and cast (2) plus the activation; erf/tanh/exp cost several instructions each.
ACTIVATION_OPS = {"none": 0, "relu": 1, "gelu": 20, "gelu_tanh": 15, "silu": 10, "sigmoid": 8, "tanh": 10}
FLAT_BIAS_MODULO_OPS = 8  # flat's bias column i % N: an integer modulo is a multi-instruction sequence
# Registers per element of a program's register tile (each element also needs its fp32 temporaries).
NORM_REGISTERS_PER_ELEMENT = {"single": 3, "looped": 4}  # looped lanes carry Welford's mean and M2 besides x
# Measured with ptxas for sm_90 (search_spaces/layernorm_backward.py): ~24 + 7 per element.
NORM_BACKWARD_REGISTERS_PER_ELEMENT = 7
REDUCTION_REGISTERS_PER_ELEMENT = 2  # the accumulator and the loaded value (max: plus an index)
POINTWISE_REGISTERS_PER_ELEMENT = 3


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
    """What the model knows about one kernel family."""

    geometry: GeometryFn  # (config, problem, warp_size) -> Geometry
    size_fields: tuple[str, ...]  # problem fields that are sizes; every other field is copied into signatures
    size_classes: SizeClassesFn  # what of the sizes the quantization sees, for every tile size in the space
    family: tuple[str, ...]  # parameters that fix the grid (explain groups configs by them)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def alignment(n: int) -> int:
    """The largest power of two, at most 16, dividing n (0 divides by anything): the kernels' DIV / ALIGN."""
    return MAX_ALIGN if n == 0 else min(MAX_ALIGN, n & -n)


def element_bytes(problem: Problem) -> int:
    return ELEMENT_BYTES[str(problem["dtype"])]


def estimate_registers(per_thread_values: float, threads: int, per_value: float = 1.0) -> int:
    """BASE_REGISTERS + per_value * values held per thread, rounded up to 8, capped where ptxas caps it."""
    wanted = BASE_REGISTERS + per_value * per_thread_values
    rounded = cdiv(int(wanted + 0.999), REGISTER_UNIT_PER_THREAD) * REGISTER_UNIT_PER_THREAD
    fits_block = REGISTER_FILE // max(1, threads) // REGISTER_UNIT_PER_THREAD * REGISTER_UNIT_PER_THREAD
    return max(REGISTER_UNIT_PER_THREAD, min(rounded, MAX_REGISTERS_PER_THREAD, fits_block))


def space_values(space: SearchSpace, name: str) -> tuple[int, ...]:
    """The integer values of a parameter of the space ((): the space has no such parameter)."""
    for param in space.params:
        if param.name == name:
            return tuple(int(v) for v in param.values)
    return ()


def _counts(size: int, blocks: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(cdiv(size, b) for b in blocks)


def _threads(config: Config, warp_size: int) -> int:
    return warp_size * int(config["num_warps"])


# ------------------------------------------------------------------------------------------------------------ GEMM


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
    e = element_bytes(problem)
    threads = _threads(config, warp_size)
    tiles_m, tiles_n = cdiv(m, bm), cdiv(n, bn)
    k_steps = cdiv(k, bk)
    steps_per_split = cdiv(k_steps, split)  # kernels/gemm.py: k_per_split = cdiv(cdiv(K, BK), SPLIT_K) * BK
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
    pipeline_smem = stages * (bm * bk + bk * bn) * e  # as search_spaces/gemm.py smem_bytes
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
    """The staged variant's copies (kernels/gemm.py `_staged`): one copy kernel per operand whose leading dim is
    no multiple of 16 bytes, reading it once and writing it with that dim padded; the tma kernel then reads the
    copy (its operand bytes, counted as for tma)."""
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    a_col, b_col = problem.get("a_layout") == "col", problem.get("b_layout") == "col"
    per_vector = ALIGN_BYTES // e
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
        ("m", next_pow2(m), _counts(m, space_values(space, "BLOCK_M")), alignment(m) if col_major_a else 0),
        ("n", next_pow2(n), _counts(n, space_values(space, "BLOCK_N")), alignment(n)),
        ("k", next_pow2(k), _counts(k, block_k), tuple(k % b == 0 for b in block_k), alignment(k)),
    )


# ----------------------------------------------------------------------------------------------- row kernels


def _norm_params(kernel: str, problem: Problem) -> int:
    """Parameter vectors ([N] weight, bias) every program reads (L2 hits after the first)."""
    if kernel == "softmax":
        return 0
    return int(bool(problem.get("weight", False))) + int(bool(problem.get("bias", False)))


def _x_passes(kernel: str, variant: str) -> int:
    """Reads of x per row: single (and window) hold the row; looped norms read it twice; softmax looped three times."""
    if variant in HOLDS_ROWS:
        return 1
    return 3 if (kernel, variant) == ("softmax", "looped") else 2


def _row_geometry(kernel: str) -> GeometryFn:
    """LayerNorm / RMSNorm / softmax forward: `single` has one program per ROWS rows holding [ROWS, BLOCK_N];
    `online` / `looped` have one program per row walking it in ceil(cols / BLOCK_N) chunks."""

    def geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
        rows, cols = int(problem["rows"]), int(problem["cols"])
        variant = str(config["variant"])
        block_n, stages = int(config["BLOCK_N"]), int(config["num_stages"])
        e = element_bytes(problem)
        threads = _threads(config, warp_size)
        if variant in HOLDS_ROWS:
            rows_per_program, chunks = int(config["ROWS"]), 1
        else:
            rows_per_program, chunks = 1, cdiv(cols, block_n)
        programs = cdiv(rows, rows_per_program)
        row_extent = chunks * block_n
        avg_rows = rows / programs
        passes = _x_passes(kernel, variant)
        params = _norm_params(kernel, problem)
        ops = NORM_OPS[kernel]
        if variant in HOLDS_ROWS:
            held = rows_per_program * block_n
            inflight = avg_rows * cols * e  # a program issues all its loads before the first reduction
        else:
            held = block_n
            inflight = block_n * e * max(1, stages - 1)
        per_thread = held / threads
        staged = (stages - 1) * block_n * e if variant not in HOLDS_ROWS else 0  # search_spaces/*: one chunk per stage
        scratch = rows_per_program * int(config["num_warps"]) * FP32_BYTES * 2  # cross-warp partial sums
        return Geometry(
            dims=(TileDim("rows", programs, rows_per_program), TileDim("cols", 1, row_extent)),
            shape=f"{rows_per_program}x{block_n}" + (f"x{chunks}" if variant not in HOLDS_ROWS else ""),
            useful_work=float(rows) * cols,
            padded_work=float(programs) * rows_per_program * row_extent,
            useful_flops=float(rows) * cols * ops,
            flops_per_tile=float(rows_per_program) * row_extent * ops,
            math="alu",
            tile_bytes=avg_rows * cols * e * (passes + 1) + params * cols * e,
            dram_bytes=float(rows) * cols * e * 2 + params * cols * e,
            inflight_bytes=inflight,
            threads=threads,
            regs_per_thread=estimate_registers(per_thread, threads, NORM_REGISTERS_PER_ELEMENT[_kind(variant)]),
            smem_bytes=staged + (scratch if int(config["num_warps"]) > 1 else 0),
        )

    return geometry


def _kind(variant: str) -> str:
    return "single" if variant in HOLDS_ROWS else "looped"


def _row_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Programs along rows for every ROWS / ROWS_PER_PROGRAM (ROWS = 1 pins rows exactly), chunks along cols for
    every BLOCK_N, the single variant's block width (next_pow2) and the alignment of cols."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    row_blocks = space_values(space, "ROWS") + space_values(space, "ROWS_PER_PROGRAM")
    return (
        ("rows", _counts(rows, row_blocks or (1,))),
        ("cols", next_pow2(cols), _counts(cols, space_values(space, "BLOCK_N")), alignment(cols)),
    )


def _norm_backward_geometry(kernel: str) -> GeometryFn:
    """LayerNorm / RMSNorm backward: one program per ROWS_PER_PROGRAM rows, each writing a partial dweight (and
    dbias) row that a second kernel sums. `single` walks its rows in [ROWS, BLOCK_N] tiles; `looped` one row at a
    time in BLOCK_N chunks, twice, updating its partial row chunk by chunk. Shape: ROWS_PER_PROGRAM/ROWSxBLOCK_N."""

    def geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
        rows, cols = int(problem["rows"]), int(problem["cols"])
        variant = str(config["variant"])
        block_n, stages = int(config["BLOCK_N"]), int(config["num_stages"])
        per_program = int(config["ROWS_PER_PROGRAM"])
        e = element_bytes(problem)
        threads = _threads(config, warp_size)
        programs = cdiv(rows, per_program)
        avg_rows = rows / programs
        wants_bias = kernel == "layernorm_backward" and bool(problem.get("bias", False))
        partials = int(bool(problem.get("weight", False))) + int(wants_bias)
        if variant == "single":
            tile_rows, chunks = int(config["ROWS"]), 1
            held = tile_rows * block_n
            inflight = 2 * min(tile_rows, avg_rows) * cols * e  # x and dy of one tile
            row_bytes = avg_rows * cols * e * 3  # x, dy in; dx out
            partial_bytes = float(partials * cols * FP32_BYTES)  # written once, at the end
        else:
            tile_rows, chunks = 1, cdiv(cols, block_n)
            held = block_n
            inflight = 2.0 * block_n * e * max(1, stages - 1)
            row_bytes = avg_rows * cols * e * 5  # x, dy twice; dx out
            partial_bytes = avg_rows * partials * cols * FP32_BYTES * 2  # read-modify-write per row
        row_extent = chunks * block_n
        workspace = float(programs) * cols * FP32_BYTES * partials
        weight_bytes = int(bool(problem.get("weight", False))) * cols * e
        return Geometry(
            dims=(TileDim("rows", programs, per_program), TileDim("cols", 1, row_extent)),
            shape=f"{per_program}/{tile_rows}x{block_n}" + (f"x{chunks}" if variant != "single" else ""),
            useful_work=float(rows) * cols,
            padded_work=float(programs) * per_program * row_extent,
            useful_flops=float(rows) * cols * NORM_BACKWARD_OPS,
            flops_per_tile=float(per_program) * row_extent * NORM_BACKWARD_OPS,
            math="alu",
            tile_bytes=row_bytes + partial_bytes + weight_bytes,
            dram_bytes=float(rows) * cols * e * 3 + workspace + weight_bytes,
            inflight_bytes=inflight,
            threads=threads,
            regs_per_thread=estimate_registers(held / threads, threads, NORM_BACKWARD_REGISTERS_PER_ELEMENT),
            smem_bytes=tile_rows * int(config["num_warps"]) * FP32_BYTES * 4 if int(config["num_warps"]) > 1 else 0,
            extra_kernels=1 if partials else 0,
            extra_dram_bytes=workspace + partials * cols * e,
        )

    return geometry


# ------------------------------------------------------------------------------------------------------ reduction


def reduction_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    """`inner`: one program per BLOCK_M rows walking cols in BLOCK_N chunks. `outer` / `outer_split`: one program
    per (batch, BLOCK_N columns, split), each walking its run of rows in BLOCK_M chunks; a split adds a combine
    pass over the fp32 partials."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    batch = int(problem.get("batch", 1)) if problem.get("axis") != "inner" else 1
    variant = str(config["variant"])
    block_m, block_n, stages = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["num_stages"])
    e = element_bytes(problem)
    op = str(problem.get("op", "sum"))
    index_bytes = 4 if op == "max" else 0  # max also returns int32 (or int64) indices
    threads = _threads(config, warp_size)
    ops = REDUCTION_OPS.get(op, 1)
    per_value = REDUCTION_REGISTERS_PER_ELEMENT + (1 if op == "max" else 0)
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
    per_split = cdiv(cdiv(rows, split), block_m) * block_m  # kernels/reduction.py _launch_outer
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
        ("rows", next_pow2(rows), _counts(rows, block_m), tuple(_counts(cdiv(rows, s), block_m) for s in splits)),
        ("cols", next_pow2(cols), _counts(cols, space_values(space, "BLOCK_N")), alignment(cols)),
    )


# ------------------------------------------------------------------------------------------------------ pointwise


def _pointwise_rows_view(problem: Problem) -> tuple[int, int]:
    """[M, N] as the launch sees x: N is the bias length (all of x when there is none), M = numel // N."""
    numel, cols = int(problem["numel"]), int(problem["cols"])
    n = cols if cols > 0 else max(1, numel)
    return max(1, numel // n), n


def pointwise_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    """`flat`: one program per BLOCK contiguous elements. `rows`: one per [BLOCK // BLOCK_N, BLOCK_N] tile of x
    viewed as [numel // N, N], the bias loaded once per tile."""
    numel = int(problem["numel"])
    block = int(config["BLOCK"])
    e = element_bytes(problem)
    threads = _threads(config, warp_size)
    residual = bool(problem.get("has_residual", False))
    bias = bool(problem.get("has_bias", False))
    streams = 2 + int(residual)  # x in, y out, residual in
    ops = 2 + ACTIVATION_OPS.get(str(problem.get("activation", "none")), 10) + int(bias) + int(residual)
    regs = estimate_registers(block / threads, threads, POINTWISE_REGISTERS_PER_ELEMENT)
    if config["variant"] == "rows":
        m, n = _pointwise_rows_view(problem)
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
        regs_per_thread=regs,
        smem_bytes=0,
    )


def pointwise_size_classes(problem: Problem, space: SearchSpace) -> tuple[object, ...]:
    """Programs for every BLOCK (flat) and every BLOCK // BLOCK_N x BLOCK_N tile (rows)."""
    numel = int(problem["numel"])
    m, n = _pointwise_rows_view(problem)
    blocks, block_ns = space_values(space, "BLOCK"), space_values(space, "BLOCK_N")
    tile_rows = tuple(sorted({max(1, b // bn) for b in blocks for bn in block_ns}))
    return (
        ("numel", next_pow2(numel), _counts(numel, blocks)),
        ("rows", next_pow2(m), _counts(m, tile_rows)),
        ("cols", next_pow2(n), _counts(n, block_ns), alignment(n)),
    )


# ------------------------------------------------------------------------------------------------------- registry

_ROW_FAMILY = ("variant", "BLOCK_N", "ROWS")

KERNEL_MODELS: dict[str, KernelModel] = {
    "gemm": KernelModel(gemm_geometry, ("m", "n", "k"), gemm_size_classes, ("variant", "BLOCK_M", "BLOCK_N")),
    "layernorm": KernelModel(_row_geometry("layernorm"), ("rows", "cols"), _row_size_classes, _ROW_FAMILY),
    "rmsnorm": KernelModel(_row_geometry("rmsnorm"), ("rows", "cols"), _row_size_classes, _ROW_FAMILY),
    "softmax": KernelModel(_row_geometry("softmax"), ("rows", "cols"), _row_size_classes, _ROW_FAMILY),
    "layernorm_backward": KernelModel(
        _norm_backward_geometry("layernorm_backward"),
        ("rows", "cols"),
        _row_size_classes,
        ("variant", "BLOCK_N", "ROWS_PER_PROGRAM"),
    ),
    "rmsnorm_backward": KernelModel(
        _norm_backward_geometry("rmsnorm_backward"),
        ("rows", "cols"),
        _row_size_classes,
        ("variant", "BLOCK_N", "ROWS_PER_PROGRAM"),
    ),
    "reduction": KernelModel(
        reduction_geometry,
        ("batch", "rows", "cols"),
        reduction_size_classes,
        ("variant", "BLOCK_M", "BLOCK_N", "SPLIT"),
    ),
    "pointwise": KernelModel(
        pointwise_geometry, ("numel", "cols"), pointwise_size_classes, ("variant", "BLOCK", "BLOCK_N")
    ),
}


def kernel_model(kernel: str) -> KernelModel | None:
    """The model of a kernel family, or None where there is none (the tuner then searches without the model)."""
    return KERNEL_MODELS.get(kernel)


def geometry(kernel: str, config: Config, problem: Problem, warp_size: int = 32) -> Geometry | None:
    model = KERNEL_MODELS.get(kernel)
    return None if model is None else model.geometry(config, problem, warp_size)


def non_size_fields(kernel: str, problem: Problem) -> tuple[tuple[str, object], ...]:
    """The problem's fields that are not sizes (dtype, layouts, epilogue flags, ...), sorted by name."""
    model = KERNEL_MODELS[kernel]
    return tuple(sorted((k, v) for k, v in problem.items() if k not in model.size_fields))


__all__ = [
    "KERNEL_MODELS",
    "Geometry",
    "KernelModel",
    "TileDim",
    "alignment",
    "geometry",
    "kernel_model",
    "non_size_fields",
]
