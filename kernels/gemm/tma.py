"""The GEMM variants `tma` and `staged`: Hopper tensor descriptors load A and B tiles, persistent programs loop
over the tiles. `staged` runs this kernel on aligned copies of A and B (kernels/gemm/host.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunekit.kernels.gemm.tiles import _dot, _epilogue_store, _tile_coords, _tile_offsets


@triton.jit
def _gemm_tma_kernel(
    a_desc,  # descriptor of A [M, K] (A_COL: of A.T [K, M]), block [BLOCK_M, BLOCK_K] (A_COL: [BLOCK_K, BLOCK_M])
    b_desc,  # descriptor of B [K, N] (B_COL: of B.T [N, K]), block [BLOCK_K, BLOCK_N] (B_COL: [BLOCK_N, BLOCK_K])
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M, N, K, stride_cm, stride_cn, stride_rm, stride_rn, alpha, beta, num_programs,
    A_COL: tl.constexpr, B_COL: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, WARP_SPECIALIZE: tl.constexpr = False,
):  # fmt: skip
    """Persistent: TMA loads zero-fill outside [M, K] / [K, N], so the main loop needs no masks.

    WARP_SPECIALIZE (not in the space; tests/gpu/gemm_staged_probe.py measures it): Triton 3.6 splits the K loop
    into a TMA-loading warp group and two MMA warp groups on Hopper, but only with num_warps=4 and an outer loop
    that is not flattened into it (otherwise it compiles the plain loop without a word).
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, num_programs, flatten=not WARP_SPECIALIZE):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in tl.range(0, k_tiles, warp_specialize=WARP_SPECIALIZE):
            off_k = ki * BLOCK_K
            a = a_desc.load([off_k, off_m]).T if A_COL else a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T if B_COL else b_desc.load([off_k, off_n])
            acc = _dot(a, b, acc, DOT_IN_FP32)
        offs_m, offs_n, mask_m, mask_n = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, BIG)
        _epilogue_store(
            acc, C, BIAS, RES, offs_m, offs_n, mask_m, mask_n, stride_cm, stride_cn, stride_rm, stride_rn,
            alpha, beta, ACT, HAS_BIAS, HAS_RESIDUAL,
        )  # fmt: skip
