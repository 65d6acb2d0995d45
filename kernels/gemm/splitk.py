"""The GEMM variant `splitk`: K split over SPLIT_K programs per tile writing fp32 partial tiles to a workspace, then
a second kernel that sums the partials in a fixed order (deterministic) and applies the epilogue once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunekit.kernels.gemm.tiles import _dot_k_range, _epilogue_store, _hint, _hint_problem, _tile_coords, _tile_offsets


@triton.jit
def _gemm_splitk_kernel(
    A,  # [M, K] input
    B,  # [K, N] input
    WS,  # [SPLIT_K, M, N] fp32 workspace of partial sums, contiguous
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    k_per_split,  # a multiple of BLOCK_K
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, BIG: tl.constexpr, DOT_IN_FP32: tl.constexpr, A_COL: tl.constexpr, B_COL: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn = _hint_problem(
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, A_COL, B_COL, ALIGN
    )
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    split = tl.program_id(1)
    offs_m, offs_n, mask_m, mask_n = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, BIG)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    # A split past the end of K runs no iteration and writes zeros: every workspace slice is written.
    acc = _dot_k_range(
        A, B, offs_m, offs_n, mask_m, mask_n, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, BIG, DOT_IN_FP32,
    )  # fmt: skip
    ws = WS + split.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws, acc, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _splitk_reduce_kernel(
    WS,  # [SPLIT_K, M, N] fp32 partial sums, contiguous
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M, N, stride_cm, stride_cn, stride_rm, stride_rn, alpha, beta,
    SPLIT_K: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BIG: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """Sum the SPLIT_K partials in a fixed order (deterministic), then apply the epilogue exactly once."""
    N = _hint(N, ALIGN)
    stride_cm = _hint(stride_cm, ALIGN)
    stride_rm = _hint(stride_rm, ALIGN)
    offs_m, offs_n, mask_m, mask_n = _tile_offsets(tl.program_id(0), tl.program_id(1), M, N, BLOCK_M, BLOCK_N, BIG)
    mask = mask_m[:, None] & mask_n[None, :]
    ws = WS + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws + s * M * N, mask=mask, other=0.0)
    _epilogue_store(
        acc, C, BIAS, RES, offs_m, offs_n, mask_m, mask_n, stride_cm, stride_cn, stride_rm, stride_rn,
        alpha, beta, ACT, HAS_BIAS, HAS_RESIDUAL,
    )  # fmt: skip
