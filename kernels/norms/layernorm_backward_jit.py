"""The backward jit kernels of LayerNorm and RMSNorm (IS_RMS): one row per program, or row chunks (looped); dweight
and dbias as persistent partial sums, which kernels/persistent.py's `_sum_partials` adds up."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _norm_bwd_single(
    X,  # [M, N] input, unit stride along N
    DY,  # [M, N] upstream gradient, unit stride along N
    DX,  # [M, N] input gradient (written), unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    DW_PART,  # [programs, N] fp32 partial dweight sums, contiguous (written only when WANT_DW)
    DB_PART,  # [programs, N] fp32 partial dbias sums, contiguous (written only when WANT_DB)
    M, N, stride_x, stride_dy, stride_dx, eps,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, WANT_DW: tl.constexpr, WANT_DB: tl.constexpr, DIV: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # Triton only learns that a size is a multiple of 16; DIV, a power of two the host found dividing N and every
    # row stride, restores 16-byte vector loads for rows like 3000 fp16 values (as in kernels/norms/layernorm.py).
    N = N // DIV * DIV
    stride_x = stride_x // DIV * DIV
    stride_dy = stride_dy // DIV * DIV
    stride_dx = stride_dx // DIV * DIV
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    # The program's dweight/dbias sums stay in registers for its whole run; the cross-row sum happens once, at
    # the end, into the program's one partial row.
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # Software pipelining by hand (Triton does not pipeline plain loads): the next tile's x and dy are loaded, in
    # their own dtype, before this tile's reductions, so each program keeps two tiles of loads in flight. Read
    # once, they are evicted first, leaving L2 to dx and the partial rows.
    next_rows = pid * ROWS + tl.arange(0, ROWS)
    next_mask = (next_rows < M)[:, None] & col_mask[None, :]
    next_rows64 = next_rows.to(tl.int64)[:, None]  # M * N may exceed 2**31 elements
    x_next = tl.load(X + next_rows64 * stride_x + cols[None, :], next_mask, 0.0, eviction_policy="evict_first")
    dy_next = tl.load(DY + next_rows64 * stride_dy + cols[None, :], next_mask, 0.0, eviction_policy="evict_first")
    # Persistent: tile t goes to program t % programs, so neighbouring programs read neighbouring rows at once.
    for tile in tl.range(pid, tl.cdiv(M, ROWS), n_programs):
        rows = tile * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        mask = row_ok[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        next_rows = rows + n_programs * ROWS
        next_mask = (next_rows < M)[:, None] & col_mask[None, :]
        next_rows64 = next_rows.to(tl.int64)[:, None]
        x_next = tl.load(X + next_rows64 * stride_x + cols[None, :], next_mask, 0.0, eviction_policy="evict_first")
        dy_next = tl.load(DY + next_rows64 * stride_dy + cols[None, :], next_mask, 0.0, eviction_policy="evict_first")
        if IS_RMS:
            xc = x
        else:
            mean = tl.sum(x, axis=1) / N
            xc = tl.where(mask, x - mean[:, None], 0.0)  # padding lanes must not enter the sums below
        # Masked-off rows get rstd 0, not rsqrt(eps): with eps = 0 that is inf, and 0 * inf would poison dweight.
        rstd = tl.where(row_ok, tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps), 0.0)
        xhat = xc * rstd[:, None]
        if HAS_WEIGHT:
            # Loaded per tile, not held across tiles: an L1 hit, and one fp32 register per element less to hold.
            w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
            g = dy * w[None, :]
        else:
            g = dy
        c1 = tl.sum(xhat * g, axis=1) / N
        if IS_RMS:
            dx = (g - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = tl.sum(g, axis=1) / N
            dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(DX + rows64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if WANT_DW:
            dw_acc += dy * xhat
        if WANT_DB:
            db_acc += dy
    part = pid.to(tl.int64) * N + cols
    if WANT_DW:
        tl.store(DW_PART + part, tl.sum(dw_acc, axis=0), mask=col_mask)
    if WANT_DB:
        tl.store(DB_PART + part, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _norm_bwd_looped(
    X,  # [M, N] input, unit stride along N
    DY,  # [M, N] upstream gradient, unit stride along N
    DX,  # [M, N] input gradient (written), unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    DW_PART,  # [programs, N] fp32 partial dweight sums, contiguous (written only when WANT_DW)
    DB_PART,  # [programs, N] fp32 partial dbias sums, contiguous (written only when WANT_DB)
    M, N, stride_x, stride_dy, stride_dx, eps,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, WANT_DW: tl.constexpr, WANT_DB: tl.constexpr, DIV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    N = N // DIV * DIV  # see _norm_bwd_single
    stride_x = stride_x // DIV * DIV
    stride_dy = stride_dy // DIV * DIV
    stride_dx = stride_dx // DIV * DIV
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    # Each program owns one workspace row; nobody else reads or writes it until _sum_partials.
    dw_part = DW_PART + pid.to(tl.int64) * N
    db_part = DB_PART + pid.to(tl.int64) * N
    lane_count = ((N - cols + BLOCK_N - 1) // BLOCK_N).to(tl.float32)
    # Persistent: row r goes to program r % programs (as the single variant's tiles). Row pointers start in int64
    # (M * N may exceed 2**31 elements) and advance by `programs` rows.
    x_row = X + pid.to(tl.int64) * stride_x
    dy_row = DY + pid.to(tl.int64) * stride_dy
    dx_row = DX + pid.to(tl.int64) * stride_dx
    for row in tl.range(pid, M, n_programs):
        # Pass 1: per-lane statistics in one read of x and dy. LayerNorm keeps Welford's mean and M2 of x and the
        # co-moment C = Σ(x - mean_x)(g - mean_g), all mean-subtracted, so a large mean costs no precision; lane k
        # has seen k values before chunk k (only the last chunk is ragged): one 1/(k+1) per chunk.
        acc_a = tl.zeros([BLOCK_N], dtype=tl.float32)  # RMS: Σx²; LN: M2 of x
        acc_b = tl.zeros([BLOCK_N], dtype=tl.float32)  # RMS: Σx·g; LN: co-moment of x and g
        lane_mx = tl.zeros([BLOCK_N], dtype=tl.float32)
        lane_mg = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in tl.range(0, n_chunks):
            offs = k * BLOCK_N + cols
            mask = offs < N
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
            if IS_RMS:
                acc_a += x * x
                acc_b += x * g
            else:
                inv = 1.0 / (k + 1.0)
                delta_x = x - lane_mx
                new_mx = lane_mx + delta_x * inv
                new_mg = lane_mg + (g - lane_mg) * inv
                acc_a = tl.where(mask, acc_a + delta_x * (x - new_mx), acc_a)
                acc_b = tl.where(mask, acc_b + delta_x * (g - new_mg), acc_b)
                lane_mx = tl.where(mask, new_mx, lane_mx)
                lane_mg = tl.where(mask, new_mg, lane_mg)
        if IS_RMS:
            mean = 0.0
            rstd = tl.rsqrt(tl.sum(acc_a, axis=0) / N + eps)
            c1 = rstd * tl.sum(acc_b, axis=0) / N  # mean(x̂ g)
            c2 = 0.0
        else:
            # Merge the lanes (Chan et al.): M2 = Σ M2_j + Σ n_j (mx_j - mx)², C likewise with the g deviations.
            mean = tl.sum(lane_count * lane_mx, axis=0) / N
            c2 = tl.sum(lane_count * lane_mg, axis=0) / N  # mean(g)
            spread_x = lane_mx - mean
            spread_g = lane_mg - c2
            var = (tl.sum(acc_a, axis=0) + tl.sum(lane_count * spread_x * spread_x, axis=0)) / N
            cov = (tl.sum(acc_b, axis=0) + tl.sum(lane_count * spread_x * spread_g, axis=0)) / N
            rstd = tl.rsqrt(var + eps)
            c1 = rstd * cov  # mean(x̂ g) = rstd * mean((x - mean) g) = rstd * cov(x, g)

        # Pass 2, last chunk first: the chunks pass 1 read most recently are the likeliest still in cache. The
        # partial sums are read, added to and written back per chunk (a row too wide to hold in registers).
        accumulate = row > pid  # the program's first row initialises its workspace row
        for k in tl.range(0, n_chunks):
            offs = (n_chunks - 1 - k) * BLOCK_N + cols
            mask = offs < N
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
            g = dy * tl.load(W + offs, mask=mask, other=0.0).to(tl.float32) if HAS_WEIGHT else dy
            xhat = (x - mean) * rstd
            dx = (g - xhat * c1 - c2) * rstd
            tl.store(dx_row + offs, dx.to(DX.dtype.element_ty), mask=mask)
            if WANT_DW:
                dw = tl.load(dw_part + offs, mask=mask & accumulate, other=0.0)
                tl.store(dw_part + offs, dw + dy * xhat, mask=mask)
            if WANT_DB:
                db = tl.load(db_part + offs, mask=mask & accumulate, other=0.0)
                tl.store(db_part + offs, db + dy, mask=mask)
        x_row += n_programs.to(tl.int64) * stride_x
        dy_row += n_programs.to(tl.int64) * stride_dy
        dx_row += n_programs.to(tl.int64) * stride_dx
