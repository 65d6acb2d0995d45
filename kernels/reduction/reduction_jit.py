"""The reduction jit kernels: inner (the reduced dim is the last) and outer (coalesced along inner), sum, mean and
max with its first index."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _max_update(cur, cur_idx, x, idx, mask, ORDERED: tl.constexpr):
    """Lane-wise running max; a NaN beats every number and the first NaN stays.

    ORDERED: each lane sees its indices in increasing order and starts from its first index with value -inf, and
    masked lanes load -inf: only a strictly greater value (or a first NaN) replaces cur, which keeps the first
    index of a tie. Otherwise (the split's second pass reads partial results), ties go to the smaller index.
    """
    first_nan = (x != x) & (cur == cur)
    tie_wins = (x == cur) & (idx < cur_idx)
    take = ((x > cur) | first_nan) if ORDERED else (((x > cur) | tie_wins | first_nan) & mask)
    return tl.where(take, x, cur), tl.where(take, idx, cur_idx)


@triton.jit
def _max_finish(cur, cur_idx, AXIS: tl.constexpr):
    """Cross-lane max along AXIS: NaN if any lane is NaN (first NaN's index), else the smallest index of the max."""
    is_nan = cur != cur
    any_nan = tl.max(is_nan.to(tl.int32), axis=AXIS) > 0
    best = tl.max(tl.where(is_nan, float("-inf"), cur), axis=AXIS)
    best_b = tl.expand_dims(best, AXIS)
    any_nan_b = tl.expand_dims(any_nan, AXIS)
    hit = tl.where(any_nan_b, is_nan, cur == best_b)
    idx = tl.min(tl.where(hit, cur_idx, 2147483647), axis=AXIS)
    return tl.where(any_nan, float("nan"), best), idx


@triton.jit
def _reduce_inner(
    X,  # [M, N] input, unit stride along N
    Y,  # [M] output values
    IDX,  # [M] output indices (written only when OP == 2, max)
    M, N, stride_xm,
    scale,  # 1/N for mean
    OP: tl.constexpr,  # 0 sum, 1 mean, 2 max
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    # int64 row offsets: M * N may exceed 2**31 elements.
    x_rows = X + rows.to(tl.int64)[:, None] * stride_xm
    cols = tl.arange(0, BLOCK_N)
    if OP == 2:
        cur = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
        cur_idx = tl.broadcast_to(cols[None, :], [BLOCK_M, BLOCK_N])  # each lane's first column
        for start in tl.range(0, N, BLOCK_N):
            offs = start + cols
            mask = row_mask[:, None] & (offs < N)[None, :]
            x = tl.load(x_rows + offs[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            cur, cur_idx = _max_update(cur, cur_idx, x, offs[None, :], mask, True)
        values, idx = _max_finish(cur, cur_idx, 1)
        tl.store(IDX + rows, idx.to(IDX.dtype.element_ty), mask=row_mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, N, BLOCK_N):
            offs = start + cols
            mask = row_mask[:, None] & (offs < N)[None, :]
            acc += tl.load(x_rows + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        values = tl.sum(acc, axis=1)
        if OP == 1:
            values = values * scale
    tl.store(Y + rows, values.to(Y.dtype.element_ty), mask=row_mask)


@triton.jit
def _reduce_outer(
    X,  # [B, M, N] input, unit stride along N
    IDX_IN,  # [B, M, N] indices of X's values, contiguous (read only when HAS_IDX_IN: the split's second pass)
    Y,  # [B, SPLIT, N] values, contiguous (SPLIT = the grid's second dim; 1 for a plain reduction)
    IDX,  # [B, SPLIT, N] indices, contiguous (written only when OP == 2, max)
    M, N, stride_xb, stride_xm,
    rows_per_split,  # rows each program along the grid's second dim reduces; a multiple of BLOCK_M
    scale,  # 1/M for mean
    OP: tl.constexpr,  # 0 sum, 1 mean, 2 max
    HAS_IDX_IN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    n_col_blocks = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    batch = pid // n_col_blocks
    cols = (pid % n_col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    split = tl.program_id(1)
    row_start = split * rows_per_split
    row_end = tl.minimum(row_start + rows_per_split, M)
    x_batch = X + batch.to(tl.int64) * stride_xb
    rows = tl.arange(0, BLOCK_M)
    if OP == 2:
        cur = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
        if HAS_IDX_IN:
            cur_idx = tl.full([BLOCK_M, BLOCK_N], 2147483647, dtype=tl.int32)
        else:
            cur_idx = tl.broadcast_to((row_start + rows)[:, None], [BLOCK_M, BLOCK_N])  # each lane's first row
        for start in tl.range(row_start, row_end, BLOCK_M):
            offs = start + rows
            mask = (offs < row_end)[:, None] & col_mask[None, :]
            offs64 = offs.to(tl.int64)[:, None]
            x = tl.load(x_batch + offs64 * stride_xm + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            if HAS_IDX_IN:
                in_offs = (batch.to(tl.int64) * M + offs64) * N + cols[None, :]
                idx = tl.load(IDX_IN + in_offs, mask=mask, other=2147483647)
            else:
                idx = offs[:, None]
            cur, cur_idx = _max_update(cur, cur_idx, x, idx, mask, not HAS_IDX_IN)
        values, idx_out = _max_finish(cur, cur_idx, 0)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in tl.range(row_start, row_end, BLOCK_M):
            offs = start + rows
            mask = (offs < row_end)[:, None] & col_mask[None, :]
            ptrs = x_batch + offs.to(tl.int64)[:, None] * stride_xm + cols[None, :]
            acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        values = tl.sum(acc, axis=0)
        if OP == 1:
            values = values * scale
    out_offs = (batch.to(tl.int64) * tl.num_programs(1) + split) * N + cols
    tl.store(Y + out_offs, values.to(Y.dtype.element_ty), mask=col_mask)
    if OP == 2:
        tl.store(IDX + out_offs, idx_out.to(IDX.dtype.element_ty), mask=col_mask)
