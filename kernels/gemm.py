"""GEMM with a fused epilogue: C = act(alpha * A @ B + bias) + beta * residual, fp32 accumulation.

A [M, K] and B [K, N] may each be row- or column-major (any strides work: they are kernel arguments); C is a
fresh row-major [M, N] of the input dtype. fp16/bf16 multiply on tensor cores with fp32 accumulation; fp32
inputs multiply as tf32. The epilogue (alpha, bias over N, activation, beta * residual) runs on the fp32
accumulator, once, before the single rounding to the output dtype.

Loads vectorise only where Triton can prove alignment: the main K loop runs whole BLOCK_K steps with no K mask
(one masked step takes the ragged end), and an ALIGN constexpr (the power of two dividing N, K and the leading
strides, computed on the host) is written into sizes and strides as x // ALIGN * ALIGN, since Triton itself only
specialises on multiples of 16. On an H200 this took 4096x3000x3000 bf16 from 0.65 ms to 0.18 ms.

Variants (see search_spaces/gemm.py): `grouped`, `persistent`, `splitk` (+ a reduce-and-epilogue kernel), `tma`
(Hopper tensor descriptors) and `staged` (the tma kernel on copies of A and B whose leading strides are padded to
16 bytes, for sizes that leave rows unaligned). Each but `staged` has its own @triton.jit function; they share the
tile-order, main-loop and epilogue helpers below.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

# tunekit.backend first, before triton itself: it sets TRITON_INTERPRET=1 without a GPU, and triton.language's
# own @triton.jit helpers (tl.cdiv, tl.sigmoid, ...) are decorated when triton is first imported.
from tunekit import backend

# isort: split
import torch
import triton
import triton.language as tl

from tunekit.device import fingerprint
from tunekit.errors import InvalidInputError, InvalidShapeError
from tunekit.search_spaces import gemm as gemm_space
from tunekit.search_spaces.gemm import (
    ACTIVATIONS,
    ALIGN_BYTES,
    LAYOUTS,
    SPACE,
    is_aligned16,
    next_pow2,
    smem_bytes,
)
from tunekit.space import Config, Problem
from tunekit.spec import DTYPES, Inputs, KernelSpec, Outputs, Tolerance

if TYPE_CHECKING:
    from tunekit.device import DeviceFingerprint

INTERPRETER_PROGRAMS = 4  # persistent/tma program count where the device reports no SM count (the interpreter)
INT32_LIMIT = 2**31 - 1
MAX_ALIGN = 16  # elements: the divisibility Triton itself specialises on; 16-byte vectors need 4-8 elements
REDUCE_BLOCK_M = 32
REDUCE_BLOCK_N = 128
REDUCE_WARPS = 4


# ----------------------------------------------------------------------------------------------- shared helpers


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
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, A_COL: tl.constexpr, B_COL: tl.constexpr, ALIGN: tl.constexpr
):
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
    offs_m,
    offs_n,
    mask_m,
    mask_n,
    k_lo,
    k_hi,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
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
    offs_m,
    offs_n,
    mask_m,
    mask_n,
    stride_cm,
    stride_cn,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
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


# --------------------------------------------------------------------------------------------------- variants


@triton.jit
def _gemm_grouped_kernel(
    A,  # [M, K] input
    B,  # [K, N] input
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    ALIGN: tl.constexpr,
):
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
        A,
        B,
        offs_m,
        offs_n,
        mask_m,
        mask_n,
        0,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        EVEN_K,
        BIG,
        DOT_IN_FP32,
    )
    _epilogue_store(
        acc,
        C,
        BIAS,
        RES,
        offs_m,
        offs_n,
        mask_m,
        mask_n,
        stride_cm,
        stride_cn,
        stride_rm,
        stride_rn,
        alpha,
        beta,
        ACT,
        HAS_BIAS,
        HAS_RESIDUAL,
    )


@triton.jit
def _gemm_persistent_kernel(
    A,  # [M, K] input
    B,  # [K, N] input
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    num_programs,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    ALIGN: tl.constexpr,
):
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
            A,
            B,
            offs_m,
            offs_n,
            mask_m,
            mask_n,
            0,
            K,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            EVEN_K,
            BIG,
            DOT_IN_FP32,
        )
        _epilogue_store(
            acc,
            C,
            BIAS,
            RES,
            offs_m,
            offs_n,
            mask_m,
            mask_n,
            stride_cm,
            stride_cn,
            stride_rm,
            stride_rn,
            alpha,
            beta,
            ACT,
            HAS_BIAS,
            HAS_RESIDUAL,
        )


@triton.jit
def _gemm_splitk_kernel(
    A,  # [M, K] input
    B,  # [K, N] input
    WS,  # [SPLIT_K, M, N] fp32 workspace of partial sums, contiguous
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    k_per_split,  # a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    ALIGN: tl.constexpr,
):
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
        A,
        B,
        offs_m,
        offs_n,
        mask_m,
        mask_n,
        k_lo,
        k_hi,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        EVEN_K,
        BIG,
        DOT_IN_FP32,
    )
    ws = WS + split.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws, acc, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _splitk_reduce_kernel(
    WS,  # [SPLIT_K, M, N] fp32 partial sums, contiguous
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M,
    N,
    stride_cm,
    stride_cn,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    SPLIT_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BIG: tl.constexpr,
    ALIGN: tl.constexpr,
):
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
        acc,
        C,
        BIAS,
        RES,
        offs_m,
        offs_n,
        mask_m,
        mask_n,
        stride_cm,
        stride_cn,
        stride_rm,
        stride_rn,
        alpha,
        beta,
        ACT,
        HAS_BIAS,
        HAS_RESIDUAL,
    )


@triton.jit
def _gemm_tma_kernel(
    a_desc,  # descriptor of A [M, K] (A_COL: of A.T [K, M]), block [BLOCK_M, BLOCK_K] (A_COL: [BLOCK_K, BLOCK_M])
    b_desc,  # descriptor of B [K, N] (B_COL: of B.T [N, K]), block [BLOCK_K, BLOCK_N] (B_COL: [BLOCK_N, BLOCK_K])
    C,  # [M, N] output
    BIAS,  # [N] (read only when HAS_BIAS)
    RES,  # [M, N] (read only when HAS_RESIDUAL)
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    num_programs,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    BIG: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr = False,
):
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
            acc,
            C,
            BIAS,
            RES,
            offs_m,
            offs_n,
            mask_m,
            mask_n,
            stride_cm,
            stride_cn,
            stride_rm,
            stride_rn,
            alpha,
            beta,
            ACT,
            HAS_BIAS,
            HAS_RESIDUAL,
        )


# ------------------------------------------------------------------------------------------------------- host


def layout_of(t: torch.Tensor) -> str:
    """'row' when the last dim is unit-stride (or has one element), 'col' when the first is, else 'strided'."""
    rows, cols = t.shape
    if cols <= 1 or t.stride(1) == 1:
        return "row"
    if rows <= 1 or t.stride(0) == 1:
        return "col"
    return "strided"


def _leading_stride(t: torch.Tensor, layout: str) -> int:
    return t.stride(0) if layout == "row" else t.stride(1)


def tensors_aligned16(*tensors: torch.Tensor | None) -> bool:
    """Every given 2-D tensor is row- or column-major with a positive leading stride spanning a multiple of 16
    bytes, and every data pointer is 16-byte aligned (1-D tensors: the pointer only): what TMA's descriptors need.
    Together with `is_aligned16`'s sizes this is the aligned16 flag."""
    for t in tensors:
        if t is None:
            continue
        if t.data_ptr() % ALIGN_BYTES:
            return False
        if t.dim() == 2:
            layout = layout_of(t)
            if layout == "strided":
                return False
            lead = _leading_stride(t, layout)
            if lead <= 0 or lead * t.element_size() % ALIGN_BYTES:
                return False
    return True


def _span(t: torch.Tensor) -> int:
    """The largest element offset a kernel computes into t (strides times last index)."""
    return sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)


def _pow2_divisor(*values: int) -> int:
    """The largest power of two, at most MAX_ALIGN, dividing every value (0 is divisible by anything)."""
    align = MAX_ALIGN
    for v in values:
        if v:
            align = min(align, v & -v)
    return align


def _alignment(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, residual: torch.Tensor | None, a_col: bool, b_col: bool
) -> int:
    """The ALIGN constexpr: what divides N, K, every leading stride, and M where A is column-major."""
    m, k = a.shape
    values = [b.shape[1], k, c.stride(0), a.stride(1) if a_col else a.stride(0), b.stride(1) if b_col else b.stride(0)]
    if a_col:
        values.append(m)
    if residual is not None:
        values.append(residual.stride(0))
    return _pow2_divisor(*values)


def _num_programs(tiles: int) -> int:
    sms = fingerprint().sm_count
    return max(1, min(tiles, sms if sms > 0 else INTERPRETER_PROGRAMS))


def _tma_descriptors(a: torch.Tensor, b: torch.Tensor, bm: int, bn: int, bk: int):
    """Host-side tensor descriptors over the unit-stride view of A and B (no allocator needed), or None when a
    tensor does not meet TMA's rules (16-byte aligned base, leading stride a multiple of 16 bytes). Sizes may be
    anything: loads past M, N or K zero-fill."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = b.shape[1]
    a_layout, b_layout = layout_of(a), layout_of(b)
    if "strided" in (a_layout, b_layout) or not tensors_aligned16(a, b) or min(m, n, k) == 0:
        return None
    if a_layout == "row":
        a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [bm, bk])
    else:
        a_desc = TensorDescriptor(a, [k, m], [a.stride(1), 1], [bk, bm])
    if b_layout == "row":
        b_desc = TensorDescriptor(b, [k, n], [b.stride(0), 1], [bk, bn])
    else:
        b_desc = TensorDescriptor(b, [n, k], [b.stride(1), 1], [bn, bk])
    return a_desc, b_desc, a_layout == "col", b_layout == "col"


def _staged(t: torch.Tensor) -> torch.Tensor:
    """t itself where TMA can describe it, else a copy of the same layout (strided: row-major) whose leading stride
    is rounded up to a multiple of 16 bytes. The copy is a view of t's shape: the padding is never read (TMA
    zero-fills past the described sizes, the plain kernels mask them), so it needs no zeros."""
    if tensors_aligned16(t):
        return t
    rows, cols = t.shape
    col = layout_of(t) == "col"
    per_vector = ALIGN_BYTES // t.element_size()
    lead = triton.cdiv(rows if col else cols, per_vector) * per_vector
    if col:
        buffer = torch.empty((cols, lead), device=t.device, dtype=t.dtype)[:, :rows].T
    else:
        buffer = torch.empty((rows, lead), device=t.device, dtype=t.dtype)[:, :cols]
    return buffer.copy_(t)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write C for 2-D A [M, K] and B [K, N] of any strides. No validation: this is the hot path."""
    a, b, bias, residual, activation, alpha, beta = inputs
    (c,) = outputs
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    group_m, split_k = int(config["GROUP_M"]), int(config["SPLIT_K"])
    variant = config["variant"] if k > 0 else "grouped"  # K == 0: no K loop to split or describe
    if variant == "staged":  # aligned copies of A and B for the tma kernel; C, bias and residual need none
        a, b, variant = _staged(a), _staged(b), "tma"
    tensors = [t for t in (a, b, c, residual) if t is not None]
    big = max(_span(t) for t in tensors) > INT32_LIMIT or (variant == "splitk" and split_k * m * n > INT32_LIMIT)
    # An absent bias or residual still needs a pointer argument; the constexpr flag keeps it unread.
    bias_arg = c if bias is None else bias
    res_arg = c if residual is None else residual
    res_strides = (0, 0) if residual is None else (residual.stride(0), residual.stride(1))
    epilogue = {"ACT": activation, "HAS_BIAS": bias is not None, "HAS_RESIDUAL": residual is not None}
    options = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    dot_in_fp32 = backend.INTERPRETED and a.dtype == torch.bfloat16
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m, "BIG": big}
    blocks["DOT_IN_FP32"] = dot_in_fp32
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    even_k = k % bk == 0

    if variant == "tma":
        descriptors = _tma_descriptors(a, b, bm, bn, bk)
        if descriptors is not None:
            a_desc, b_desc, a_col, b_col = descriptors
            programs = _num_programs(tiles)
            _gemm_tma_kernel[(programs,)](
                a_desc,
                b_desc,
                c,
                bias_arg,
                res_arg,
                m,
                n,
                k,
                c.stride(0),
                c.stride(1),
                *res_strides,
                float(alpha),
                float(beta),
                programs,
                A_COL=a_col,
                B_COL=b_col,
                # Not a parameter of the space: only tests/gpu/gemm_staged_probe.py sets it.
                WARP_SPECIALIZE=bool(config.get("WARP_SPECIALIZE", False)),
                **epilogue,
                **blocks,
                **options,
            )
            return
        variant = "grouped"  # not TMA-compatible (the op never dispatches tma then): same tiles, plain loads

    a_col, b_col = layout_of(a) == "col", layout_of(b) == "col"
    align = _alignment(a, b, c, residual, a_col, b_col)
    layout = {"A_COL": a_col, "B_COL": b_col, "ALIGN": align}
    mainloop_args = (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    if variant == "splitk":
        k_per_split = triton.cdiv(triton.cdiv(k, bk), split_k) * bk
        ws = torch.empty((split_k, m, n), device=a.device, dtype=torch.float32)
        _gemm_splitk_kernel[(tiles, split_k)](
            a, b, ws, *mainloop_args, k_per_split, EVEN_K=even_k, **blocks, **layout, **options
        )
        grid = (triton.cdiv(m, REDUCE_BLOCK_M), triton.cdiv(n, REDUCE_BLOCK_N))
        _splitk_reduce_kernel[grid](
            ws,
            c,
            bias_arg,
            res_arg,
            m,
            n,
            c.stride(0),
            c.stride(1),
            *res_strides,
            float(alpha),
            float(beta),
            SPLIT_K=split_k,
            BLOCK_M=REDUCE_BLOCK_M,
            BLOCK_N=REDUCE_BLOCK_N,
            BIG=big,
            ALIGN=_pow2_divisor(n, c.stride(0), *res_strides[:1]),
            num_warps=REDUCE_WARPS,
            **epilogue,
        )
        return

    common = (a, b, c, bias_arg, res_arg, *mainloop_args, c.stride(0), c.stride(1), *res_strides)
    if variant == "persistent":
        programs = _num_programs(tiles)
        _gemm_persistent_kernel[(programs,)](
            *common, float(alpha), float(beta), programs, EVEN_K=even_k, **epilogue, **blocks, **layout, **options
        )
    else:
        _gemm_grouped_kernel[(tiles,)](
            *common, float(alpha), float(beta), EVEN_K=even_k, **epilogue, **blocks, **layout, **options
        )


def alloc_outputs(inputs: Inputs) -> Outputs:
    a, b = inputs[0], inputs[1]
    return (torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype),)


def epilogue_reference(
    acc: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    """The epilogue in torch, in acc's dtype: act(alpha * acc + bias) + beta * residual."""
    y = acc * alpha
    if bias is not None:
        y = y + bias.to(acc.dtype)
    if activation == "relu":
        y = torch.relu(y)
    elif activation == "gelu":
        y = torch.nn.functional.gelu(y)
    elif activation == "gelu_tanh":
        y = torch.nn.functional.gelu(y, approximate="tanh")
    elif activation == "silu":
        y = torch.nn.functional.silu(y)
    if residual is not None:
        y = y + beta * residual.to(acc.dtype)
    return y


def reference(inputs: Inputs) -> Outputs:
    a, b, bias, residual, activation, alpha, beta = inputs
    acc = a.double() @ b.double()
    return (epilogue_reference(acc, bias, residual, activation, alpha, beta).to(a.dtype),)


def _operand(rows: int, cols: int, layout: str, pad: int, randn) -> torch.Tensor:
    """A [rows, cols] tensor of the layout, its leading dim padded by `pad` elements (pad > 0: unaligned)."""
    if layout == "row":
        return randn(rows, cols + pad)[:, :cols]
    return randn(cols, rows + pad)[:, :rows].T


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    dtype = DTYPES[str(problem["dtype"])]
    a_layout, b_layout = str(problem["a_layout"]), str(problem["b_layout"])
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)).to(dtype)

    # An unaligned problem whose sizes happen to be aligned gets unaligned leading strides, as in real use: one
    # element of padding leaves each leading stride 2 or 4 bytes past a multiple of 16 bytes.
    pad = 1 if not problem["aligned16"] and is_aligned16(m, n, k, str(problem["dtype"]), a_layout) else 0
    # B scaled by 1/sqrt(K) keeps A @ B ~ N(0, 1) for any K, so fixed tolerances hold at every size.
    a = _operand(m, k, a_layout, pad, randn)
    b = _operand(k, n, b_layout, pad, lambda *shape: randn(*shape, scale=1 / math.sqrt(max(k, 1))))
    bias = randn(n, scale=0.5) if problem["has_bias"] else None
    residual = randn(m, n) if problem["has_residual"] else None
    # alpha, beta != 1 so that a kernel ignoring either fails verification.
    return (a, b, bias, residual, str(problem["activation"]), 0.75, 0.5)


def make_problem(
    m: int,
    n: int,
    k: int,
    dtype: str,
    *,
    a_layout: str = "row",
    b_layout: str = "row",
    activation: str = "none",
    has_bias: bool = False,
    has_residual: bool = False,
) -> Problem:
    """The problem of contiguous operands of these sizes (alignment in bytes from the exact sizes and dtype)."""
    return {
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "a_layout": a_layout,
        "b_layout": b_layout,
        "activation": activation,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "aligned16": is_aligned16(m, n, k, dtype, a_layout),
    }


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    if len(shape) != 3:
        raise InvalidShapeError(f"gemm takes a 3-D shape MxNxK (e.g. 4096x4096x4096), but got {len(shape)}-D {shape}")
    m, n, k = shape
    if min(m, n, k) < 1:
        raise InvalidShapeError(f"gemm shape sizes must be >= 1, but got {m}x{n}x{k}")
    if dtype not in DTYPES:
        raise InvalidInputError(f"gemm dtype must be one of {sorted(DTYPES)}, but got {dtype!r}")
    return make_problem(m, n, k, dtype)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: tiny problems, tuned in seconds.
    if device.is_interpreter:
        return [
            # K >= 128 so that splitk (K >= 2 * SPLIT_K * BLOCK_K, BLOCK_K >= 32) is explored too; 136 is no
            # multiple of 16.
            make_problem(32, 32, 128, "float32", activation="relu", has_bias=True),
            make_problem(17, 33, 136, "float16", b_layout="col", has_residual=True),
        ]
    return [
        make_problem(4096, 4096, 4096, "bfloat16", activation="gelu", has_bias=True),
        # Skinny M (decode / small-batch linear layers): weights [out, in] make B column-major.
        make_problem(128, 8192, 8192, "bfloat16", b_layout="col"),
        make_problem(16, 4096, 4096, "bfloat16", b_layout="col"),
        make_problem(3000, 3000, 3000, "bfloat16", activation="gelu", has_bias=True),
        make_problem(4097, 4096, 4096, "bfloat16"),
    ]


_SAFE = {
    "variant": "grouped",
    "BLOCK_M": 16,
    "BLOCK_N": 16,
    "BLOCK_K": 16,
    "GROUP_M": 1,
    "SPLIT_K": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    """A grouped (or, for few tiles and long K on a GPU, splitk; for unaligned sizes on Hopper past skinny M,
    staged) config sized to the problem, always valid.

    GPU shapes follow what measured best on an H200 among hand-picked configs (bf16): 128x256x64, 8 warps, 4
    stages for large M and N; 16..64 x 64 x 128, 5 stages for skinny M (memory-bound: deep K tiles, many tiles).
    """
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    wide = problem["dtype"] != "float32"  # 2-byte elements: twice the K per byte of shared memory
    if device.is_interpreter:
        edge_m, edge_n, bk, stages = 32, 32, 32, 3
    elif m <= 64:
        edge_m, edge_n, bk, stages = 64, 64, 128 if wide else 64, 5
    else:
        edge_m, edge_n, bk, stages = 128, 256 if wide else 128, 64 if wide else 32, 4 if wide else 3
    # Tensor-core tiles are at least 64 wide unless the problem itself is smaller (the space's block_*_at_least_64).
    bm = max(min(edge_m, max(16, next_pow2(m))), min(64, next_pow2(m)))
    bn = max(min(edge_n, max(16, next_pow2(n))), min(64, next_pow2(n)))
    bk = min(bk, max(16, next_pow2(k)))
    grouped: dict = {
        "variant": "grouped",
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": 1 if triton.cdiv(m, bm) == 1 else 8,
        "SPLIT_K": 1,
        "num_warps": 8 if bm * bn >= 128 * 128 else 4,
        "num_stages": stages,
    }
    candidates = [grouped]
    unaligned = not is_aligned16(m, n, k, str(problem["dtype"]), str(problem["a_layout"]))
    if m > 64 and unaligned and gemm_space.has_tma(device):
        # Rows of unaligned length load element by element: bf16 2053^3 ran 5x faster on aligned copies (H200).
        candidates.insert(0, dict(grouped, variant="staged"))
    if device.sm_count > 0:  # few tiles and a long K: split K until the programs fill the SMs
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        split = 1
        while split < 8 and tiles * split * 2 <= device.sm_count and k >= 2 * (split * 2) * bk:
            split *= 2
        if split > 1:
            candidates.insert(0, dict(grouped, variant="splitk", SPLIT_K=split))
    for config in candidates:
        while config["num_stages"] > 3 and not SPACE.is_valid(config, problem, device):
            config["num_stages"] -= 1
        if SPACE.is_valid(config, problem, device):
            return config
    return next(iter(SPACE.valid_configs(problem, device)), dict(_SAFE))


def bytes_moved(problem: Problem) -> int:
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    size = DTYPES[str(problem["dtype"])].itemsize
    return (m * k + k * n + m * n * (2 if problem["has_residual"] else 1) + n * bool(problem["has_bias"])) * size


def flops(problem: Problem) -> int:
    return 2 * int(problem["m"]) * int(problem["n"]) * int(problem["k"])


SPEC = KernelSpec(
    name="gemm",
    description="C = act(alpha * A @ B + bias) + beta * residual; fp32 accumulation (tf32 for fp32 inputs), "
    "A and B row- or column-major",
    space=SPACE,
    problem_fields=(
        "m",
        "n",
        "k",
        "dtype",
        "a_layout",
        "b_layout",
        "activation",
        "has_bias",
        "has_residual",
        "aligned16",
    ),
    launch=launch,
    alloc_outputs=alloc_outputs,
    reference=reference,
    make_inputs=make_inputs,
    problem_from_shape=problem_from_shape,
    default_problems=default_problems,
    heuristic=heuristic,
    # Outputs are ~N(0, 1) (make_inputs scales B by 1/sqrt(K)). fp16/bf16: both sides round the same fp32-exact
    # products, so they differ by at most about one output ulp (2**-9 / 2**-6 near 2..4) plus summation order.
    # fp32 multiplies as tf32 (10-bit mantissa): ~1e-3 absolute error on N(0, 1) outputs.
    tolerances={
        "float32": Tolerance(atol=1e-2, rtol=1e-2),
        "float16": Tolerance(atol=1e-2, rtol=1e-2),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
    bytes_moved=bytes_moved,
    flops=flops,
    version=1,
    shape_help="MxNxK, e.g. 4096x4096x4096 (A [M, K] @ B [K, N], both row-major)",
)

__all__ = [
    "ACTIVATIONS",
    "LAYOUTS",
    "SPEC",
    "epilogue_reference",
    "launch",
    "layout_of",
    "make_problem",
    "smem_bytes",
    "tensors_aligned16",
]
