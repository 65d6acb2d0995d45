"""Search space of the fused-epilogue GEMM (kernels/gemm/): C = act(alpha * A @ B + bias) + beta * residual.

Five variants, one kernel function each but `staged`, which runs `tma`'s:
- `grouped`: one program per C tile, tiles launched in GROUP_M-row bands so neighbouring programs share A and
  B tiles in L2.
- `persistent`: min(#SMs, tiles) programs, each looping over tiles in the same grouped order (no tail wave of
  launches; the next tile's loads overlap the previous tile's epilogue).
- `splitk`: K is split across SPLIT_K programs per tile, each writing an fp32 partial tile to a workspace
  [SPLIT_K, M, N]; a second small kernel sums the partials in a fixed order (deterministic) and applies the
  epilogue once. For few output tiles and long K (e.g. 16x4096x4096), where tiles alone cannot fill the GPU.
- `tma`: Hopper's tensor memory accelerator loads A and B tiles through host-side tensor descriptors; persistent
  like `persistent`. Only where the device has TMA (NVIDIA, compute capability >= 9.0) and base pointers and
  leading strides are 16-byte aligned (the aligned16 flag); sizes need not divide anything (TMA zero-fills tiles
  past the edge).
- `staged`: `tma` for problems whose sizes leave rows unaligned (e.g. bf16 2053^3, where every load of the other
  variants goes element by element): each operand whose leading stride is not a multiple of 16 bytes is first
  copied into a buffer whose leading dimension is rounded up to one, then the `tma` kernel runs on the copies and
  writes C directly (C, bias and residual are read and written with masks: they need no copy). The copies are
  part of its time, so the tuner weighs them against plain loads. Tile parameters as `tma`. Only where the
  device has TMA and the problem's sizes are not 16-byte aligned (where they are, `tma` needs no copies).

The space is sized so that an exhaustive sweep of one shape takes minutes on an H200 (150-400 valid configs for
the shapes in the recorded timing tables, cache/timings/): parameters whose value cannot change the kernel are
pinned by rules (GROUP_M where there is one row of tiles, SPLIT_K outside splitk), and tile sizes that cannot win
are ruled out (tensor-core tiles under 64 where the problem is larger, splitk where the tiles alone fill the GPU).

The problem is a mapping with keys m, n, k (exact; problems that quantize alike share results through the
tuner's quantization signature, tunekit.tuning.perf_model), dtype, a_layout / b_layout
("row" or "col"), activation, has_bias, has_residual and aligned16 (16 bytes, not 16 elements: every operand's
leading stride and data pointer is 16-byte aligned; see `is_aligned16`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import VECTOR_BYTES, cdiv, element_bytes, next_pow2, threads

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

VARIANTS = ("grouped", "persistent", "splitk", "tma", "staged")
TMA_VARIANTS = ("tma", "staged")  # the variants that run the tensor-descriptor kernel
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
LAYOUTS = ("row", "col")
# fp32 accumulator values one thread may hold before the tile spills (255 registers, the rest for addresses).
MAX_ACC_PER_THREAD = 128
# Below this many tile elements per warp, eight warps idle on each other.
MIN_TILE_PER_WARP = 1024
MAX_SPLITK_WORKSPACE_BYTES = 512 * 1024 * 1024
ALIGN_BYTES = VECTOR_BYTES  # TMA: base pointers and global (leading) strides must be multiples of 16 bytes


def is_aligned16(m: int, n: int, k: int, dtype: str, a_layout: str) -> bool:
    """Sizes part of the aligned16 flag (16 BYTES): N and K (and M when A is column-major) times the element size
    are multiples of 16 bytes.

    These are the operands' leading dimensions: A's K (row-major [M, K]) or M (column-major), B's N (row-major
    [K, N]) or K (column-major), and N for C and the residual (row-major [M, N]); N and K count whatever B's layout.
    The op also requires every leading stride to span a multiple of 16 bytes and every data pointer to be 16-byte
    aligned before it sets the flag (`tensors_aligned16`, tunekit/ops/gemm.py); a problem parsed from a shape has
    contiguous operands, so sizes decide it. That is what TMA's tensor descriptors need: sizes themselves need no
    alignment (tiles past the edge load as zeros), so bf16 3000x3000x3000 (6000-byte rows) is aligned, and 2-byte
    types need multiples of 8 elements, fp32 multiples of 4. (The non-TMA kernels' ALIGN hint is separate: the
    power of two, in elements, dividing the runtime sizes and strides, kernels/gemm/host.py `_alignment`.)
    """
    size = element_bytes(dtype)
    dims = (n, k) if a_layout == "row" else (n, k, m)
    return all(d * size % ALIGN_BYTES == 0 for d in dims)


def compute_major(device: DeviceFingerprint) -> int:
    """The major compute capability, 0 where there is none (the interpreter's "none")."""
    try:
        return int(device.compute_capability.split(".")[0])
    except ValueError:
        return 0


def has_tma(device: DeviceFingerprint) -> bool:
    return device.vendor == "nvidia" and compute_major(device) >= 9


def smem_bytes(config: Config, problem: Problem) -> int:
    """Shared memory the software pipeline buffers: num_stages tiles of A and of B."""
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    return int(config["num_stages"]) * (bm * bk + bk * bn) * element_bytes(str(problem["dtype"]))


def _group_m_canonical(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    one_row_of_tiles = cdiv(int(problem["m"]), int(config["BLOCK_M"])) == 1
    return (int(config["GROUP_M"]) == 1) == one_row_of_tiles


def _block_k_16_for_short_k(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_K"]) > 16 or next_pow2(int(problem["k"])) <= 16


def _block_m_at_least_64(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_M"]) >= min(64, next_pow2(int(problem["m"])))


def _block_n_at_least_64(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_N"]) >= min(64, next_pow2(int(problem["n"])))


def _splitk_few_tiles(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] != "splitk" or device.sm_count == 0:
        return True
    tiles = cdiv(int(problem["m"]), int(config["BLOCK_M"])) * cdiv(int(problem["n"]), int(config["BLOCK_N"]))
    return tiles < device.sm_count


def _splitk_iff_split(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return (config["variant"] == "splitk") == (int(config["SPLIT_K"]) > 1)


def _splitk_long_k(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] != "splitk":
        return True
    return int(problem["k"]) >= 2 * int(config["SPLIT_K"]) * int(config["BLOCK_K"])


def _splitk_workspace(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] != "splitk":
        return True
    return int(config["SPLIT_K"]) * int(problem["m"]) * int(problem["n"]) * 4 <= MAX_SPLITK_WORKSPACE_BYTES


def _tma_device(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] not in TMA_VARIANTS or has_tma(device)


def _tma_aligned(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "tma" or bool(problem["aligned16"])


def _staged_unaligned_sizes(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    # From the sizes, not the aligned16 flag: a problem with aligned sizes but unaligned strides (the recorded
    # 3000^3 table) would copy just to re-align pointers, and its recorded config set must stay what it was.
    if config["variant"] != "staged":
        return True
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    return not is_aligned16(m, n, k, str(problem["dtype"]), str(problem["a_layout"]))


def _fits_smem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if device.smem_per_block == 0:  # the interpreter has no shared memory limit
        return True
    return smem_bytes(config, problem) <= device.smem_per_block


def _block_k_within_k(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_K"]) <= max(16, next_pow2(int(problem["k"])))


def _block_m_within_m(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_M"]) <= max(16, next_pow2(int(problem["m"])))


def _block_n_within_n(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_N"]) <= max(16, next_pow2(int(problem["n"])))


def _acc_fits_registers(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_M"]) * int(config["BLOCK_N"]) <= MAX_ACC_PER_THREAD * threads(config)


def _warps_have_work(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    tile = int(config["BLOCK_M"]) * int(config["BLOCK_N"])
    return config["num_warps"] == 4 or tile >= MIN_TILE_PER_WARP * int(config["num_warps"])


SPACE = SearchSpace(
    params=(
        Choice("variant", VARIANTS),
        PowerOfTwo("BLOCK_M", 16, 256),
        PowerOfTwo("BLOCK_N", 16, 256),
        PowerOfTwo("BLOCK_K", 16, 128),
        Choice("GROUP_M", (1, 8)),
        PowerOfTwo("SPLIT_K", 1, 8),
        PowerOfTwo("num_warps", 4, 8),
        Choice("num_stages", (3, 4, 5)),
    ),
    rules=(
        Rule(
            "splitk_iff_split_k_above_1",
            _splitk_iff_split,
            why="SPLIT_K only means something to the splitk variant, and splitk with SPLIT_K=1 is grouped plus an "
            "extra reduction pass",
        ),
        Rule(
            "splitk_only_when_tiles_do_not_fill_the_gpu",
            _splitk_few_tiles,
            why="split K only where the output tiles number fewer than the SMs (skinny M, few tiles): otherwise the "
            "tiles fill the GPU and the split only adds the fp32 workspace round trip",
        ),
        Rule(
            "group_m_8_unless_one_row_of_tiles",
            _group_m_canonical,
            why="GROUP_M bands tile rows so neighbours share B in L2 (8 rows, Triton's tutorial value); with one row "
            "of tiles there is nothing to group and GROUP_M=1 is the same kernel",
        ),
        Rule(
            "block_k_16_only_for_short_k",
            _block_k_16_for_short_k,
            why="16-deep K steps halve the work per shared-memory load against 32; only where K itself is <= 16",
        ),
        Rule(
            "block_m_at_least_64",
            _block_m_at_least_64,
            why="BLOCK_M >= min(64, next_pow2(M)): Hopper's warpgroup MMA works on 64-row tiles; smaller tiles only "
            "for problems that small (skinny M)",
        ),
        Rule(
            "block_n_at_least_64",
            _block_n_at_least_64,
            why="BLOCK_N >= min(64, next_pow2(N)): narrower tiles reload A for every 16 or 32 columns",
        ),
        Rule(
            "splitk_needs_long_k",
            _splitk_long_k,
            why="each split should run at least two BLOCK_K steps (K >= 2*SPLIT_K*BLOCK_K); shorter splits pay the "
            "workspace round trip for nothing",
        ),
        Rule(
            "splitk_workspace_at_most_512MiB",
            _splitk_workspace,
            why="the fp32 workspace is SPLIT_K*M*N*4 bytes; where it is that large, M*N has tiles enough to fill "
            "the GPU without splitting K",
        ),
        Rule(
            "tma_needs_hopper",
            _tma_device,
            why="tensor descriptors (TMA: the tma and staged variants) exist on NVIDIA compute capability >= 9.0 "
            "only; never in the interpreter",
        ),
        Rule(
            "tma_needs_aligned16",
            _tma_aligned,
            why="TMA descriptors need 16-byte aligned base pointers and leading strides in bytes (the problem's "
            "aligned16 flag); sizes need no alignment, tiles past the edge are zero-filled",
        ),
        Rule(
            "staged_only_for_unaligned_sizes",
            _staged_unaligned_sizes,
            why="staged copies operands whose rows are not a multiple of 16 bytes (N, K, or M for column-major A); "
            "where the sizes are aligned there is nothing to stage and tma runs on the operands themselves",
        ),
        Rule(
            "pipeline_fits_shared_memory",
            _fits_smem,
            why="num_stages*(BLOCK_M*BLOCK_K + BLOCK_K*BLOCK_N)*element bytes must fit the block's shared memory "
            "(skipped where the limit is unknown: the interpreter)",
        ),
        Rule(
            "block_k_within_k",
            _block_k_within_k,
            why="BLOCK_K <= max(16, next_pow2(K)): a larger block only multiplies zero padding",
        ),
        Rule(
            "block_m_within_m",
            _block_m_within_m,
            why="BLOCK_M <= max(16, next_pow2(M)): a larger block only computes masked-off rows",
        ),
        Rule(
            "block_n_within_n",
            _block_n_within_n,
            why="BLOCK_N <= max(16, next_pow2(N)): a larger block only computes masked-off columns",
        ),
        Rule(
            "accumulator_fits_registers",
            _acc_fits_registers,
            why="the fp32 BLOCK_M*BLOCK_N accumulator must stay <= 128 values per thread, else it spills",
        ),
        Rule(
            "eight_warps_need_big_tile",
            _warps_have_work,
            why="8 warps on a tile under 8192 elements leave warps idle; 4 warps is the floor",
        ),
    ),
)
