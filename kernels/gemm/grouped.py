"""The GEMM variants `grouped` and `persistent`: pointer loads, one program per C tile or one per SM looping over
tiles in the same grouped order (no tail wave of launches; the next tile's loads overlap the previous epilogue).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunekit.kernels.gemm.tiles import _dot_k_range, _epilogue_store, _hint, _hint_problem, _tile_coords, _tile_offsets


@triton.jit
def _gemm_grouped_kernel(
    A,  # [M, K] input
    B,  # [K, N] input
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_rm, stride_rn, alpha, beta,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, A_COL: tl.constexpr, B_COL: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn = _hint_problem(
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, A_COL, B_COL, ALIGN
    )
    stride_cm = _hint(stride_cm, ALIGN)
    stride_rm = _hint(stride_rm, ALIGN)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    offs_m, offs_n, mask_m, mask_n = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, BIG)
    acc = _dot_k_range(
        A, B, offs_m, offs_n, mask_m, mask_n, 0, K, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, BIG, DOT_IN_FP32,
    )  # fmt: skip
    _epilogue_store(
        acc, C, BIAS, RES, offs_m, offs_n, mask_m, mask_n, stride_cm, stride_cn, stride_rm, stride_rn,
        alpha, beta, ACT, HAS_BIAS, HAS_RESIDUAL,
    )  # fmt: skip


@triton.jit
def _gemm_persistent_kernel(
    A,  # [M, K] input
    B,  # [K, N] input
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_rm, stride_rn, alpha, beta,
    num_programs,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, A_COL: tl.constexpr, B_COL: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn = _hint_problem(
        M, N, K, stride_am, stride_ak, stride_bk, stride_bn, A_COL, B_COL, ALIGN
    )
    stride_cm = _hint(stride_cm, ALIGN)
    stride_rm = _hint(stride_rm, ALIGN)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m, offs_n, mask_m, mask_n = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, BIG)
        acc = _dot_k_range(
            A, B, offs_m, offs_n, mask_m, mask_n, 0, K, stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, BIG, DOT_IN_FP32,
        )  # fmt: skip
        _epilogue_store(
            acc, C, BIAS, RES, offs_m, offs_n, mask_m, mask_n, stride_cm, stride_cn, stride_rm, stride_rn,
            alpha, beta, ACT, HAS_BIAS, HAS_RESIDUAL,
        )  # fmt: skip
