"""LayerNorm forward over the last dim of a 2-D tensor: y = (x - mean) * rstd * w + b.

Statistics are fp32 and mean-subtracted (never E[x²] - E[x]², which cancels catastrophically on large means).
Three variants (see search_spaces/norms/layernorm.py): `single` keeps ROWS whole rows in registers and reads x once;
`looped` walks one row in BLOCK_N chunks, reading x twice (Welford statistics, then normalise); `window` is
`single` for rows that start inside a 16-byte vector, read through aligned windows (kernels/row_window.py).

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import sys
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, KernelSpec, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    check_shape,
    element_bytes,
    next_pow2,
    normal_sampler,
    pow2_divisor,
    prev_pow2,
    problems_from_shapes,
    row_flops,
    vector_elements,
    warps_for,
)
from tunekit.kernels.row_window import row_window, row_window_load, store_row_window, window_fits
from tunekit.kernels.rows_perf_model import forward_model, norm_params
from tunekit.kernels.tolerances import ONE_ULP_UP_TO_4
from tunekit.search_spaces.norms.layernorm import SPACE
from tunekit.search_spaces.rows import MAX_CHUNKS, single_block_n

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

DEFAULT_EPS = 1e-5


@triton.jit
def _layernorm_fwd_single(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    B,  # [N] bias (read only when HAS_BIAS)
    M, N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # Triton only learns that a size is a multiple of 16; rows of 3000 fp16 values would lose their 16-byte
    # vector loads. DIV, a power of two the host found dividing N and both strides, restores that knowledge.
    N = N // DIV * DIV
    stride_x = stride_x // DIV * DIV
    stride_y = stride_y // DIV * DIV
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    # int64 row offsets: M * N may exceed 2**31 elements.
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)

    mean = tl.sum(x, axis=1) / N
    # Padding lanes must not add (0 - mean)² to the variance.
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    y = xc * tl.rsqrt(var + eps)[:, None]

    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_BIAS:
        b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = y + b[None, :]
    tl.store(Y + rows64 * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_fwd_looped(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    B,  # [N] bias (read only when HAS_BIAS)
    N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    N = N // DIV * DIV  # see _layernorm_fwd_single
    stride_x = stride_x // DIV * DIV
    stride_y = stride_y // DIV * DIV
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)

    # Pass 1: a Welford mean/M2 per lane. Every lane has seen k values before chunk k (only the last chunk is
    # ragged), so the 1/(k+1) update weight is one scalar per chunk, not a division per element.
    lane_mean = tl.zeros([BLOCK_N], dtype=tl.float32)
    lane_m2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(0, n_chunks):
        offs = k * BLOCK_N + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        delta = x - lane_mean
        new_mean = lane_mean + delta * (1.0 / (k + 1.0))
        lane_m2 = tl.where(mask, lane_m2 + delta * (x - new_mean), lane_m2)
        lane_mean = tl.where(mask, new_mean, lane_mean)

    # Merge the lanes (Chan et al.): M2 = sum(M2_j) + sum(n_j * (mean_j - mean)²), all mean-subtracted.
    lane_count = ((N - cols + BLOCK_N - 1) // BLOCK_N).to(tl.float32)
    mean = tl.sum(lane_count * lane_mean, axis=0) / N
    spread = lane_mean - mean
    var = (tl.sum(lane_m2, axis=0) + tl.sum(lane_count * spread * spread, axis=0)) / N
    rstd = tl.rsqrt(var + eps)

    # Pass 2, last chunk first: the chunks pass 1 read most recently are the likeliest still in cache.
    for k in range(0, n_chunks):
        offs = (n_chunks - 1 - k) * BLOCK_N + cols
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_fwd_window(
    X,  # [M, N] input, unit stride along N, 16-byte aligned
    Y,  # [M, N] output, same strides as X, 16-byte aligned
    W,  # [N] weight (read only when HAS_WEIGHT)
    B,  # [N] bias (read only when HAS_BIAS)
    M, N, stride, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    offs, col, in_row, chunk_in, chunk_full, last = row_window(M, N, stride, VEC, BLOCK_N, ROWS)
    x = row_window_load(X, offs, in_row, chunk_in, last)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(in_row, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    y = xc * tl.rsqrt(var + eps)[:, None]
    # The row's columns sit at a different lane in each row: weight and bias are gathered (L1 hits after the first row).
    if HAS_WEIGHT:
        y = y * tl.load(W + col, mask=in_row, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + col, mask=in_row, other=0.0).to(tl.float32)
    store_row_window(Y, offs, y.to(Y.dtype.element_ty), in_row, chunk_full)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write y = layer_norm(x) for a 2-D x with unit stride along N. No validation: this is the hot path."""
    x, weight, bias, eps = inputs
    (y,) = outputs
    m, n = x.shape
    if m == 0 or n == 0:
        return
    block_n, rows = int(config["BLOCK_N"]), int(config["ROWS"])
    common = {
        "HAS_WEIGHT": weight is not None,
        "HAS_BIAS": bias is not None,
        "DIV": pow2_divisor(n, x.stride(0), y.stride(0)),
        "BLOCK_N": block_n,
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    # An absent weight or bias still needs a pointer argument; the constexpr flag keeps it unread.
    w = x if weight is None else weight
    b = x if bias is None else bias
    if config["variant"] == "window" and window_fits(x, y):
        vec = vector_elements(DTYPE_NAMES[x.dtype])
        del common["DIV"]
        grid = (triton.cdiv(m, rows),)
        _layernorm_fwd_window[grid](x, y, w, b, m, n, x.stride(0), float(eps), VEC=vec, ROWS=rows, **common)
    elif config["variant"] in ("single", "window"):  # window on tensors it cannot take: the same rows, plain loads
        if config["variant"] == "window":
            common["BLOCK_N"] = single_block_n(n)
        grid = (triton.cdiv(m, rows),)
        _layernorm_fwd_single[grid](x, y, w, b, m, n, x.stride(0), y.stride(0), float(eps), ROWS=rows, **common)
    else:
        _layernorm_fwd_looped[(m,)](x, y, w, b, n, x.stride(0), y.stride(0), float(eps), **common)


def alloc_outputs(inputs: Inputs) -> Outputs:
    return (torch.empty_like(inputs[0]),)


def reference(inputs: Inputs) -> Outputs:
    x, weight, bias, eps = inputs
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return (F.layer_norm(x.float(), (x.shape[1],), w, b, eps).to(x.dtype),)


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs today: torch's LayerNorm in the input dtype."""
    x, weight, bias, eps = inputs
    return (F.layer_norm(x, (x.shape[1],), weight, bias, eps),)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    # An offset mean catches a kernel that forgets to subtract it; weights near 1, small biases keep y O(1).
    x = (randn(rows, cols) * 2.0 + 0.5).to(dtype)
    weight = (1.0 + 0.1 * randn(cols)).to(dtype) if problem["weight"] else None
    bias = (0.1 * randn(cols)).to(dtype) if problem["bias"] else None
    return (x, weight, bias, DEFAULT_EPS)


ROWS_USAGE = "a 2-D shape MxN (e.g. 4096x1024)"  # the norms' CLI shapes


def norm_spec(module: str, **declared: Any) -> KernelSpec:
    """The spec of a LayerNorm or RMSNorm kernel module, forward or backward (KernelSpec.of_module; `declared` holds
    the rest). Its problems are those its problem_from_shape parses from an MxN shape, and the spec's problem fields
    theirs: rows, cols, dtype, weight and, for LayerNorm, bias."""
    fields = tuple(vars(sys.modules[module])["problem_from_shape"]((1, 1), "float32"))
    return KernelSpec.of_module(
        module, problem_fields=fields, shape_help="MxN, e.g. 4096x1024", torch_fallback=True, **declared
    )  # torch_fallback: every norm op runs torch's own where dispatch serves torch


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("layernorm", shape, dtype, ROWS_USAGE, (2,))
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": True, "bias": True}


def key_of(inputs: Inputs) -> ProblemKey:
    x, weight, bias, _ = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], weight is not None, bias is not None)


_INTERPRETER_SHAPES = ((16, 256), (8, 1000), (4, 4097))
_GPU_SHAPES = tuple(
    (shape, "float16")
    for shape in (
        (16384, 1024),
        (8192, 2048),
        (4096, 4096),
        (4096, 4097),
        (2048, 8192),
        (2048, 8191),
        (1024, 16384),
        (1024, 25600),
        (65536, 768),
        (8, 4096),
    )
)


default_problems = problems_from_shapes(problem_from_shape, _INTERPRETER_SHAPES, _GPU_SHAPES)


# Heuristic constants, from exhaustive sweeps of this space on an H200 (17 shapes, fp16 mostly): two rows per
# program and 16 values per thread for rows up to 16384 wide, 4096-wide chunks beyond. The heuristic came
# within 0.85-1.0 of the best config on every shape swept. RMSNorm's forward uses it too (same space, the same
# memory traffic; not yet swept for RMSNorm itself).
SINGLE_MAX_BLOCK_N = 16384
TARGET_TILE = 2048
PER_THREAD = 16
LOOPED_BLOCK_N = 4096
FEW_ROWS_BLOCK_N = 16384


def _looped(block_n: int, warps: int) -> Config:
    return {"variant": "looped", "BLOCK_N": block_n, "ROWS": 1, "num_warps": warps, "num_stages": 1}


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    itemsize = element_bytes(str(problem["dtype"]))
    width = single_block_n(cols)
    if cols * itemsize % 16 and cols >= 2048:
        # Rows not starting on 16 bytes load element by element; short chunks with 8 bytes per thread kept
        # the most loads in flight (1.5-2.3x a whole-row block at 8191 and 4097 wide).
        block_n = min(LOOPED_BLOCK_N, max(512, next_pow2(cols) // MAX_CHUNKS))
        return _looped(block_n, warps_for(block_n * itemsize, 8, 32))
    if width <= SINGLE_MAX_BLOCK_N:
        per_program = max(2, TARGET_TILE // width) if width < SINGLE_MAX_BLOCK_N else 1
        if device.sm_count > 0:  # keep at least two programs per SM
            per_program = min(per_program, prev_pow2(rows // (2 * device.sm_count)))
        per_program = min(per_program, prev_pow2(rows), 64)
        return {
            "variant": "single",
            "BLOCK_N": width,
            "ROWS": per_program,
            "num_warps": warps_for(per_program * width, PER_THREAD, 16),
            "num_stages": 1,
        }
    if 0 < rows < device.sm_count:  # fewer rows than SMs: each program gets a whole SM's worth of warps
        return _looped(FEW_ROWS_BLOCK_N, 32)
    return _looped(LOOPED_BLOCK_N, 16)


def bytes_moved(problem: Problem) -> int:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    return (2 * rows * cols + norm_params(problem) * cols) * element_bytes(str(problem["dtype"]))


flops = row_flops(8)


# fp32: rsqrt and summation order differ from torch by ~1e-6 relative. fp16/bf16: |y| is up to ~4.
TOLERANCES = {"float32": Tolerance(atol=1e-4, rtol=1e-4), **ONE_ULP_UP_TO_4}

# What RMSNorm's forward declares as this kernel does: its space (RMSNorm has no space file of its own) and tolerances.
SHARED_DECLARATION = {"space": SPACE, "tolerances": TOLERANCES}

SPEC = norm_spec(
    __name__,
    name="layernorm",
    description="LayerNorm forward over the last dim of a 2-D tensor (fp32 statistics, optional weight/bias)",
    space=SPACE,
    tolerances=TOLERANCES,
    version=1,
    # Arithmetic per element ~10 fp32 operations; looped reads x twice; the weight and bias vectors.
    model=forward_model(ops=10, looped_reads={"looped": 2}, params=norm_params),
)
