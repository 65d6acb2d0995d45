"""The elementwise chain's backward jit kernel: d input from the forward's activations recomputed in fp32, d bias as
persistent partial sums."""

from __future__ import annotations

import math

import triton
import triton.language as tl

from tunekit.kernels.pointwise.pointwise import GELU_TANH_K, GELU_TANH_K3, SQRT_HALF

INV_SQRT_2PI = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))  # gelu's normal density at 0


@triton.jit
def _sigmoid_slope(t):
    """sigmoid(t) and sigmoid(t) * (1 - sigmoid(t)) = e / (1 + e)², from one e = exp(-|t|) in (0, 1]."""
    e = tl.exp(-tl.abs(t))
    r = 1.0 / (1.0 + e)
    er = e * r  # sigmoid(-|t|): no cancellation, unlike 1 - sigmoid(|t|)
    return tl.where(t >= 0.0, r, er), er * r


@triton.jit
def _activation_backward(dy, z, ACTIVATION: tl.constexpr):
    """dz = dy * act'(z), elementwise in fp32."""
    if ACTIVATION == "relu":
        dz = tl.where(z <= 0.0, 0.0, dy)  # not z > 0: a NaN z passes the gradient, as torch's threshold_backward
    elif ACTIVATION == "gelu":
        dz = dy * (0.5 * (1.0 + tl.math.erf(z * SQRT_HALF)) + z * tl.exp(-0.5 * z * z) * INV_SQRT_2PI)
    elif ACTIVATION == "gelu_tanh":
        s, slope = _sigmoid_slope(z * (GELU_TANH_K + GELU_TANH_K3 * z * z))
        dz = dy * (s + z * slope * (GELU_TANH_K + 3.0 * GELU_TANH_K3 * z * z))
    elif ACTIVATION == "silu":
        s, slope = _sigmoid_slope(z)
        dz = dy * (s + z * slope)
    elif ACTIVATION == "sigmoid":
        _, slope = _sigmoid_slope(z)
        dz = dy * slope
    elif ACTIVATION == "tanh":
        _, slope = _sigmoid_slope(2.0 * z)
        dz = dy * (4.0 * slope)
    else:
        dz = dy
    return dz


@triton.jit
def _tile_offsets(tile, cols, col_mask, M, N, ROWS: tl.constexpr):
    """Offsets and mask of row tile `tile` over the program's columns (int64 where tile or cols are)."""
    rows = tile * ROWS + tl.arange(0, ROWS)
    return rows[:, None] * N + cols[None, :], (rows < M)[:, None] & col_mask[None, :]


@triton.jit
def _pointwise_bwd(
    DY,  # [M, N] upstream gradient, contiguous
    X,  # [M, N] input, contiguous
    B,  # [N] bias (read only when HAS_BIAS)
    DX,  # [M, N] input gradient (written), contiguous
    DB_PART,  # [row_programs, N] fp32 partial d_bias sums, contiguous (written only when WANT_DB)
    M, N, n_col_tiles, scale,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, WANT_DB: tl.constexpr, INT64: tl.constexpr,
    DIV: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # DIV, a power of two the host found dividing N, restores 16-byte vector loads on rows like 3000 fp16 values
    # (Triton itself only learns divisibility by 16), as in kernels/norms/layernorm_backward.py.
    N = N // DIV * DIV
    # Column tiles fastest: neighbouring programs read neighbouring columns of the same rows.
    pid = tl.program_id(0)
    col_tile = pid % n_col_tiles
    row_program = pid // n_col_tiles
    row_programs = tl.num_programs(0) // n_col_tiles
    cols = (col_tile.to(tl.int64) * BLOCK_N if INT64 else col_tile * BLOCK_N) + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_BIAS:
        b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)  # held for the program's whole run
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # Software pipelining by hand (Triton does not pipeline plain loads): the next tile's grad and input are loaded,
    # in their own dtype, before this tile's math. Masked-off lanes load 0: dz is 0 there (act' is finite at the
    # bias), so they add nothing to the sums.
    first = row_program.to(tl.int64) if INT64 else row_program  # the loop's tiles are int64 with it
    offs, mask = _tile_offsets(first, cols, col_mask, M, N, ROWS)
    dy_next = tl.load(DY + offs, mask, 0.0, eviction_policy="evict_first")
    x_next = tl.load(X + offs, mask, 0.0, eviction_policy="evict_first")
    for tile in tl.range(first, tl.cdiv(M, ROWS), row_programs):
        offs, mask = _tile_offsets(tile, cols, col_mask, M, N, ROWS)
        dy = dy_next.to(tl.float32)
        z = x_next.to(tl.float32) * scale
        next_offs, next_mask = _tile_offsets(tile + row_programs, cols, col_mask, M, N, ROWS)
        dy_next = tl.load(DY + next_offs, next_mask, 0.0, eviction_policy="evict_first")
        x_next = tl.load(X + next_offs, next_mask, 0.0, eviction_policy="evict_first")
        if HAS_BIAS:
            z += b[None, :]
        dz = _activation_backward(dy, z, ACTIVATION)
        tl.store(DX + offs, (dz * scale).to(DX.dtype.element_ty), mask=mask)
        if WANT_DB:
            db_acc += dz
    if WANT_DB:
        tl.store(DB_PART + row_program.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)
