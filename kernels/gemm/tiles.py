"""The GEMM variants' shared @triton.jit building blocks: tile order, alignment hints, the K loop and the epilogue.

Loads vectorise only where Triton can prove alignment: the main K loop runs whole BLOCK_K steps with no K mask
(one masked step takes the ragged end), and an ALIGN constexpr (the power of two dividing N, K and the leading
strides, computed on the host) is written into sizes and strides as x // ALIGN * ALIGN, since Triton itself only
specialises on multiples of 16. On an H200 this took 4096x3000x3000 bf16 from 0.65 ms to 0.18 ms.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile id -> (pid_m, pid_n), walking GROUP_M tile rows column by column so A and B tiles stay in L2."""
    tiles_per_group = GROUP_M * num_pid_n
    group_id = tile_id // tiles_per_group
    first_pid_m = group_id * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    in_group = tile_id % tiles_per_group
    return first_pid_m + in_group % group_rows, in_group // group_rows


@triton.jit
def _hint(x, ALIGN: tl.constexpr):
    """x itself (the host checked x % ALIGN == 0), written so that Triton's alignment analysis knows it divides.

    Triton only specialises integers on divisibility by 16; a size or leading stride of, say, 3000 would make
    every masked load along it scalar. x // ALIGN * ALIGN carries divisibility ALIGN into the masks and addresses.
    """
    if ALIGN > 1:
        x = x // ALIGN * ALIGN
    return x


@triton.jit
def _hint_problem(
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, A_COL: tl.constexpr, B_COL: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """Alignment hints for N, K, the leading strides of A and B, and M where A is column-major (contiguous in M)."""
    N = _hint(N, ALIGN)
    K = _hint(K, ALIGN)
    if A_COL:
        M = _hint(M, ALIGN)
        stride_ak = _hint(stride_ak, ALIGN)
    else:
        stride_am = _hint(stride_am, ALIGN)
    if B_COL:
        stride_bn = _hint(stride_bn, ALIGN)
    else:
        stride_bk = _hint(stride_bk, ALIGN)
    return M, N, K, stride_am, stride_ak, stride_bk, stride_bn


@triton.jit
def _tile_offsets(pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BIG: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    if BIG:  # some tensor spans 2**31 elements or more: 64-bit offsets
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    return offs_m, offs_n, mask_m, mask_n


@triton.jit
def _dot_k_range(
    A,  # [M, K] input, strides (stride_am, stride_ak)
    B,  # [K, N] input, strides (stride_bk, stride_bn)
    offs_m, offs_n, mask_m, mask_n, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    """fp32 accumulator of A[offs_m, k_lo:k_hi] @ B[k_lo:k_hi, offs_n]; k_lo is a multiple of BLOCK_K."""
    offs_k = k_lo + tl.arange(0, BLOCK_K)
    if BIG:
        offs_k = offs_k.to(tl.int64)
        step_a = tl.full((), BLOCK_K, tl.int64) * stride_ak
        step_b = tl.full((), BLOCK_K, tl.int64) * stride_bk
    else:
        step_a = BLOCK_K * stride_ak
        step_b = BLOCK_K * stride_bk
    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Whole BLOCK_K steps with no mask along K (a K mask of unknown alignment would stop vectorised loads), ...
    k_main = k_hi if EVEN_K else k_lo + (k_hi - k_lo) // BLOCK_K * BLOCK_K
    for _ in range(k_lo, k_main, BLOCK_K):
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        acc = _dot(a, b, acc, DOT_IN_FP32)
        a_ptrs += step_a
        b_ptrs += step_b
    # ... then at most one ragged step, masked.
    if not EVEN_K:  # noqa: SIM102  (a compile-time branch around a run-time one: not one `and`)
        if k_main < k_hi:
            mask_k = (k_main + tl.arange(0, BLOCK_K)) < k_hi
            a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc = _dot(a, b, acc, DOT_IN_FP32)
    return acc


@triton.jit
def _dot(a, b, acc, DOT_IN_FP32: tl.constexpr):
    # tf32 for fp32 inputs; ignored for fp16/bf16, which multiply exactly into the fp32 accumulator.
    if DOT_IN_FP32:
        # Only in the interpreter, whose dot multiplies bf16's raw bits: bf16 products are exact in fp32, so
        # upcasting first gives the tensor-core result.
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision="tf32")


@triton.jit
def _tanh(x):
    # tanh(x) = 2 * sigmoid(2x) - 1: no overflow for large |x| (exp saturates to 0 or inf, never inf/inf).
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _epilogue_store(
    acc,
    C,  # [M, N] output, strides (stride_cm, stride_cn)
    BIAS,  # [N] bias, unit stride (read only when HAS_BIAS)
    RES,  # [M, N] residual, strides (stride_rm, stride_rn) (read only when HAS_RESIDUAL)
    offs_m, offs_n, mask_m, mask_n, stride_cm, stride_cn, stride_rm, stride_rn, alpha, beta,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """C = act(alpha * acc + bias) + beta * residual, computed in fp32, rounded once to C's dtype."""
    y = acc * alpha
    if HAS_BIAS:
        bias = tl.load(BIAS + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        y = y + bias[None, :]
    if ACT == "relu":
        y = tl.maximum(y, 0.0)
    elif ACT == "gelu":
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        y = 0.5 * y * (1.0 + _tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
    elif ACT == "silu":
        y = y * tl.sigmoid(y)
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_RESIDUAL:
        r = tl.load(RES + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask, other=0.0)
        y = y + beta * r.to(tl.float32)
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, y.to(C.dtype.element_ty), mask=mask)
