"""LayerNorm backward over the last dim of a 2-D tensor: dx, dweight, dbias from x, dy and the weight.

The statistics are recomputed from x (the forward saves nothing), in fp32 and mean-subtracted like the forward.
With x̂ = (x - mean) * rstd and g = dy * w:

    dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)),    dweight = Σ_rows dy * x̂,    dbias = Σ_rows dy

Persistent grid: min(tiles, PROGRAMS_PER_SM × SMs) programs (SMs from the device fingerprint; the interpreter,
which has none, counts 2 so CPU tests run several programs). Program p takes row tiles p, p + programs, ...:
at any moment neighbouring programs read neighbouring rows (DRAM pages stay open, every row load is a coalesced
run of one row), the split is fixed by (M, config, SM count), and programs differ by at most one tile. Each keeps
its dweight/dbias sums in fp32 registers for its whole run and writes ONE partial row of a workspace
[programs, N] at the end; `_sum_partials` adds those rows in a fixed order. The workspace is a few rows per SM
(PROGRAMS_PER_SM is searched, 1-8, kept to counts whose programs are resident at once), not one per row block:
before this design, workspace traffic and its reduction cost more than the gradients (0.23 of copy bandwidth at
2048×16384). No atomics: the result is bitwise repeatable for a config on a device.

Two variants (see search_spaces/norms/layernorm_backward.py): `single` holds [ROWS, BLOCK_N] tiles of whole rows in
registers and reads x and dy once (up to 8192 columns: 32 warps at 8 elements a thread fit 64 registers); the
weight is re-read per tile (an L1 hit) rather than held, which keeps one register per element free for that.
`looped` walks one row in BLOCK_N chunks twice (one pass of per-lane Welford mean/M2 and co-moment of x and g,
then dx), adding into its workspace row in memory. Looped is for rows wider than 8192, outside the widths this
kernel is tuned for; it was kept rather than split into column blocks: a column split keeps dweight slices in
registers but needs every row's mean(g) and mean(g·x̂) first, i.e. a statistics pass reading x and dy again
(10 bytes moved per bf16 element instead of 6), and the looped re-read mostly hits L2 for one row.
Loads keep the DIV trick (a power of two dividing N and the row strides) for 16-byte vectors on odd widths.

The same kernels compute RMSNorm's backward (IS_RMS: no mean, no dbias); kernels/norms/rmsnorm_backward.py declares it.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tunekit.core.device import fingerprint
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    check_shape,
    element_bytes,
    normal_sampler,
    pow2_divisor,
    prev_pow2,
    problems_from_shapes,
    row_flops,
    warps_for,
)
from tunekit.kernels.norms.layernorm import ROWS_USAGE, norm_spec
from tunekit.kernels.norms.rmsnorm import GPU_SHAPES
from tunekit.kernels.persistent import PersistentTiling, autograd_baseline
from tunekit.kernels.rows_perf_model import backward_model, norm_params
from tunekit.kernels.tolerances import ONE_ULP_UP_TO_4
from tunekit.search_spaces.norms.layernorm_backward import MAX_BLOCK_N, SPACE, persistent_programs
from tunekit.search_spaces.rows import MAX_CHUNKS, single_block_n

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

DEFAULT_EPS = 1e-5
# The partial-sum reduction: a program adds 32 columns (one 128-byte line of fp32 per partial row), 64 rows at a
# time, in partial-row order. It reads programs * N * 4 bytes per gradient (mostly from L2, just written):
# PROGRAMS_PER_SM sets the program count, so the tuner weighs this traffic against latency hiding.
SUM_BLOCK_N = 32
SUM_BLOCK_G = 64
SUM_WARPS = 4


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


@triton.jit
def _sum_partials(
    DW_PART,  # [G, N] fp32 partial dweight sums, contiguous (read only when WANT_DW)
    DB_PART,  # [G, N] fp32 partial dbias sums, contiguous (read only when WANT_DB)
    DW,  # [N] dweight (written when WANT_DW)
    DB,  # [N] dbias (written when WANT_DB)
    G, N,
    WANT_DW: tl.constexpr, WANT_DB: tl.constexpr, DIV: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    N = N // DIV * DIV  # see _norm_bwd_single: partial rows N apart keep 16-byte loads when DIV allows
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc_w = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        parts = g0 + tl.arange(0, BLOCK_G)
        mask = (parts < G)[:, None] & col_mask[None, :]
        offs = parts.to(tl.int64)[:, None] * N + cols[None, :]
        if WANT_DW:
            acc_w += tl.load(DW_PART + offs, mask=mask, other=0.0)
        if WANT_DB:
            acc_b += tl.load(DB_PART + offs, mask=mask, other=0.0)
    if WANT_DW:
        tl.store(DW + cols, tl.sum(acc_w, axis=0).to(DW.dtype.element_ty), mask=col_mask)
    if WANT_DB:
        tl.store(DB + cols, tl.sum(acc_b, axis=0).to(DB.dtype.element_ty), mask=col_mask)


def launch_backward(
    config: Config,
    x: torch.Tensor,
    dy: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    dx: torch.Tensor,
    dw: torch.Tensor | None,
    db: torch.Tensor | None,
    is_rms: bool,
) -> None:
    """Write dx, and dw / db where given, for 2-D x, dy, dx with unit stride along N. No validation: hot path."""
    m, n = x.shape
    if n == 0:
        return
    if m == 0:  # a sum over no rows
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return
    n_programs = persistent_programs(config, m, fingerprint(x.device.index).sm_count)
    want_dw, want_db = dw is not None, db is not None
    # fp32 workspaces of partial sums, one row per program (every element the sum kernel reads is written first);
    # an unwanted one is a placeholder pointer, never read. Separate allocations keep both 16-byte aligned.
    dw_part = torch.empty((n_programs, n), dtype=torch.float32, device=x.device) if want_dw else x
    db_part = torch.empty((n_programs, n), dtype=torch.float32, device=x.device) if want_db else x
    common = {
        "IS_RMS": is_rms,
        "HAS_WEIGHT": weight is not None,
        "WANT_DW": want_dw,
        "WANT_DB": want_db,
        "DIV": pow2_divisor(n, x.stride(0), dy.stride(0), dx.stride(0)),
        "BLOCK_N": int(config["BLOCK_N"]),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    w = x if weight is None else weight  # an absent weight still needs a pointer; HAS_WEIGHT keeps it unread
    args = (x, dy, dx, w, dw_part, db_part, m, n, x.stride(0), dy.stride(0), dx.stride(0), float(eps))
    if config["variant"] == "single":
        _norm_bwd_single[(n_programs,)](*args, ROWS=int(config["ROWS"]), **common)
    else:
        _norm_bwd_looped[(n_programs,)](*args, **common)
    if want_dw or want_db:
        _sum_partials[(triton.cdiv(n, SUM_BLOCK_N),)](
            dw_part,
            db_part,
            x if dw is None else dw,
            x if db is None else db,
            n_programs,
            n,
            WANT_DW=want_dw,
            WANT_DB=want_db,
            DIV=pow2_divisor(n),
            BLOCK_G=SUM_BLOCK_G,
            BLOCK_N=SUM_BLOCK_N,
            num_warps=SUM_WARPS,
        )


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """inputs (x, dy, weight | None, want_dweight, want_dbias, eps); outputs (dx, [dweight], [dbias])."""
    x, dy, weight, want_dw, want_db, eps = inputs
    dx = outputs[0]
    dw = outputs[1] if want_dw else None
    db = outputs[1 + int(want_dw)] if want_db else None
    launch_backward(config, x, dy, weight, eps, dx, dw, db, is_rms=False)


def alloc_outputs(inputs: Inputs) -> Outputs:
    x, _, weight, want_dw, want_db, _ = inputs
    outputs = [torch.empty_like(x)]
    if want_dw:
        outputs.append(torch.empty_like(weight))
    if want_db:
        outputs.append(x.new_empty(x.shape[1]))
    return tuple(outputs)


def reference(inputs: Inputs) -> Outputs:
    """torch autograd on float64 copies, cast back to the outputs' dtypes."""
    x, dy, weight, want_dw, want_db, eps = inputs
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if weight is not None else None
    b64 = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device, requires_grad=True) if want_db else None
    y = F.layer_norm(x64, (x.shape[1],), w64, b64, eps)
    leaves = [x64] + ([w64] if want_dw else []) + ([b64] if want_db else [])
    grads = torch.autograd.grad(y, leaves, dy.double())
    dtypes = [x.dtype] + ([weight.dtype] if want_dw else []) + ([x.dtype] if want_db else [])
    return tuple(g.to(d) for g, d in zip(grads, dtypes))


def _torch_forward(inputs: Inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x, _, weight, want_dw, want_db, eps = inputs
    xr = x.detach().requires_grad_()
    wr = weight.detach().requires_grad_(bool(want_dw)) if weight is not None else None
    br = torch.zeros_like(x[0]).requires_grad_() if want_db else None
    y = F.layer_norm(xr, (x.shape[1],), wr, br, eps)
    return y, [xr] + ([wr] if wr is not None and want_dw else []) + ([br] if br is not None else [])


def torch_baseline(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """What a user runs today: torch's LayerNorm backward (autograd) in the input dtype."""
    return autograd_baseline(inputs, _torch_forward)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    # An offset mean catches a kernel that forgets to subtract it; weights near 1.
    x = (randn(rows, cols) * 2.0 + 0.5).to(dtype)
    dy = randn(rows, cols).to(dtype)
    weight = (1.0 + 0.1 * randn(cols)).to(dtype) if problem["weight"] else None
    return (x, dy, weight, bool(problem["weight"]), bool(problem["bias"]), DEFAULT_EPS)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("layernorm_backward", shape, dtype, ROWS_USAGE, (2,))
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": True, "bias": True}


def key_of(inputs: Inputs) -> ProblemKey:
    x, _, weight, _, want_db, _ = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], weight is not None, want_db)


INTERPRETER_SHAPES = ((16, 256), (8, 1000), (4, 2049))


default_problems = problems_from_shapes(problem_from_shape, INTERPRETER_SHAPES, GPU_SHAPES)


# Heuristic constants, from a sweep of this kernel on an H200 (bf16, LayerNorm and RMSNorm, N 1535-8192: ROWS 1-4 x
# PROGRAMS_PER_SM 1-8 x 2-32 warps; 2026-11-24, tests/gpu/norm_backward_bench.py sweeps around them). The fastest
# configs held 64 bytes of a tile per thread (32 bf16 values, plus the prefetched next tile) in tiles of at least
# 8 KiB, and ran 8 warps per SM: 2 programs of 4 warps, or 1 of 8. Rows wider than 8192 take the looped variant in
# 2048-wide chunks (4096 past 16 chunks). RMSNorm's backward uses it too.
TILING = PersistentTiling(tile_bytes=8192, thread_bytes=64, warps_per_sm=8)
LOOPED_PER_THREAD = 8
LOOPED_BLOCK_N = 2048
WIDE_LOOPED_BLOCK_N = 4096


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    size = element_bytes(str(problem["dtype"]))
    width = single_block_n(cols)
    if width <= MAX_BLOCK_N:
        variant, block_n = "single", width
        tile_rows = TILING.tile_rows(width, size, prev_pow2(rows))
        warps = TILING.warps(tile_rows * block_n, size)
    else:
        variant, tile_rows = "looped", 1
        block_n = LOOPED_BLOCK_N if cols <= LOOPED_BLOCK_N * MAX_CHUNKS else WIDE_LOOPED_BLOCK_N
        warps = warps_for(block_n, LOOPED_PER_THREAD, 32)
    config: Config = {
        "variant": variant,
        "BLOCK_N": block_n,
        "ROWS": tile_rows,
        "PROGRAMS_PER_SM": 1,
        "num_warps": warps,
        "num_stages": 1,
    }
    per_sm = TILING.programs_per_sm(warps)
    while per_sm > 1 and not SPACE.is_valid({**config, "PROGRAMS_PER_SM": per_sm}, problem, device):
        per_sm //= 2  # fewer resident programs, or fewer than the rows have work for
    return {**config, "PROGRAMS_PER_SM": per_sm}


def bytes_moved(problem: Problem) -> int:
    """x and dy read, dx written, the weight read and dweight/dbias written; the workspace is not counted."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    vectors = 2 * int(bool(problem["weight"])) + int(bool(problem.get("bias", False)))
    return (3 * rows * cols + vectors * cols) * element_bytes(str(problem["dtype"]))


flops = row_flops(12)


# fp32: dweight sums `rows` products whose order differs from torch's; an error of ~1e-5 on sums of O(sqrt(rows))
# is expected. fp16/bf16: as the forward.
TOLERANCES = {"float32": Tolerance(atol=1e-3, rtol=1e-4), **ONE_ULP_UP_TO_4}

# What LayerNorm's and RMSNorm's backward declare alike: they run launch_backward (so share its version), with one
# space (search_spaces/rmsnorm_backward.py is this one), heuristic and tolerance table; the model's partials are
# the weight vectors (dweight, and dbias for LayerNorm).
SHARED_DECLARATION = {
    "space": SPACE,
    "tolerances": TOLERANCES,
    "version": 3,
    "model": backward_model(partials=norm_params),
}

SPEC = norm_spec(
    __name__,
    name="layernorm_backward",
    description="LayerNorm backward over the last dim of a 2-D tensor: dx, dweight, dbias (stats recomputed)",
    **SHARED_DECLARATION,
)
