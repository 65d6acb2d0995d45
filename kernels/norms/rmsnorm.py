"""RMSNorm forward over the last dim of a 2-D tensor: y = x * rsqrt(mean(x²) + eps) * w.

fp32 statistics. Three variants, as the LayerNorm forward (kernels/norms/layernorm.py) and sharing its search space:
`single` keeps ROWS whole rows in registers and reads x once; `looped` walks one row in BLOCK_N chunks, reading x
twice (sum of squares, then normalise); `window` is `single` through 16-byte aligned windows for rows that start
inside a vector (kernels/row_window.py).

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import torch
import triton
import triton.language as tl

from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, row_bucket
from tunekit.kernels.common import (
    check_shape,
    element_bytes,
    normal_sampler,
    pow2_divisor,
    problems_from_shapes,
    row_flops,
    vector_elements,
)
from tunekit.kernels.norms.layernorm import ROWS_USAGE, SHARED_DECLARATION, norm_spec
from tunekit.kernels.norms.layernorm import heuristic as heuristic  # the spec's: the same space, the same traffic
from tunekit.kernels.row_window import row_window, row_window_load, store_row_window, window_fits
from tunekit.kernels.rows_perf_model import forward_model, norm_params
from tunekit.search_spaces.rows import single_block_n

DEFAULT_EPS = 1e-6


@triton.jit
def _rmsnorm_fwd_single(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    M, N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # Triton only learns that a size is a multiple of 16; DIV, a power of two the host found dividing N and both
    # strides, restores 16-byte vector loads for rows like 3000 fp16 values (as in kernels/norms/layernorm.py).
    N = N // DIV * DIV
    stride_x = stride_x // DIV * DIV
    stride_y = stride_y // DIV * DIV
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)[:, None]  # M * N may exceed 2**31 elements
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows64 * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_fwd_looped(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    N, stride_x, stride_y, eps,
    HAS_WEIGHT: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    N = N // DIV * DIV  # see _rmsnorm_fwd_single
    stride_x = stride_x // DIV * DIV
    stride_y = stride_y // DIV * DIV
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)

    # Pass 1: per-lane sums of squares (all terms positive: no cancellation to guard against).
    lane_ss = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(0, n_chunks):
        offs = k * BLOCK_N + cols
        x = tl.load(x_row + offs, mask=offs < N, other=0.0).to(tl.float32)
        lane_ss += x * x
    rstd = tl.rsqrt(tl.sum(lane_ss, axis=0) / N + eps)

    # Pass 2, last chunk first: the chunks pass 1 read most recently are the likeliest still in cache.
    for k in range(0, n_chunks):
        offs = (n_chunks - 1 - k) * BLOCK_N + cols
        mask = offs < N
        y = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_fwd_window(
    X,  # [M, N] input, unit stride along N, 16-byte aligned
    Y,  # [M, N] output, same strides as X, 16-byte aligned
    W,  # [N] weight (read only when HAS_WEIGHT)
    M, N, stride, eps,
    HAS_WEIGHT: tl.constexpr, VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    offs, col, in_row, chunk_in, chunk_full, last = row_window(M, N, stride, VEC, BLOCK_N, ROWS)
    x = row_window_load(X, offs, in_row, chunk_in, last)
    y = x * tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)[:, None]
    if HAS_WEIGHT:  # gathered: the row's columns sit at a different lane in each row
        y = y * tl.load(W + col, mask=in_row, other=0.0).to(tl.float32)
    store_row_window(Y, offs, y.to(Y.dtype.element_ty), in_row, chunk_full)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write y = rms_norm(x) for a 2-D x with unit stride along N. No validation: this is the hot path."""
    x, weight, eps = inputs
    (y,) = outputs
    m, n = x.shape
    if m == 0 or n == 0:
        return
    rows = int(config["ROWS"])
    common = {
        "HAS_WEIGHT": weight is not None,
        "DIV": pow2_divisor(n, x.stride(0), y.stride(0)),
        "BLOCK_N": int(config["BLOCK_N"]),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    w = x if weight is None else weight  # an absent weight still needs a pointer; HAS_WEIGHT keeps it unread
    if config["variant"] == "window" and window_fits(x, y):
        del common["DIV"]
        vec = vector_elements(DTYPE_NAMES[x.dtype])
        _rmsnorm_fwd_window[(triton.cdiv(m, rows),)](
            x, y, w, m, n, x.stride(0), float(eps), VEC=vec, ROWS=rows, **common
        )
    elif config["variant"] in ("single", "window"):  # window on tensors it cannot take: the same rows, plain loads
        if config["variant"] == "window":
            common["BLOCK_N"] = single_block_n(n)
        _rmsnorm_fwd_single[(triton.cdiv(m, rows),)](
            x, y, w, m, n, x.stride(0), y.stride(0), float(eps), ROWS=rows, **common
        )
    else:
        _rmsnorm_fwd_looped[(m,)](x, y, w, n, x.stride(0), y.stride(0), float(eps), **common)


def alloc_outputs(inputs: Inputs) -> Outputs:
    return (torch.empty_like(inputs[0]),)


def _rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight.float() if weight is not None else y


def reference(inputs: Inputs) -> Outputs:
    x, weight, eps = inputs
    return (_rms_norm_fp32(x, weight, eps).to(x.dtype),)


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs today: torch's RMSNorm in the input dtype."""
    x, weight, eps = inputs
    return (torch.nn.functional.rms_norm(x, (x.shape[1],), weight, eps),)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    # An offset mean catches a kernel that subtracts one; weights near 1 keep y O(1).
    x = (randn(rows, cols) * 2.0 + 0.5).to(dtype)
    weight = (1.0 + 0.1 * randn(cols)).to(dtype) if problem["weight"] else None
    return (x, weight, DEFAULT_EPS)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("rmsnorm", shape, dtype, ROWS_USAGE, (2,))
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": True}


def key_of(inputs: Inputs) -> ProblemKey:
    x, weight, _ = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], weight is not None)


INTERPRETER_SHAPES = ((16, 256), (8, 1000), (4, 4097))
# Also the norm backwards' (kernels/norms/layernorm_backward.py).
GPU_SHAPES = (
    ((16384, 1024), "float16"),
    ((4096, 4096), "bfloat16"),
    ((4096, 4097), "float16"),
    ((2048, 8192), "bfloat16"),
    ((1024, 25600), "float16"),
    ((65536, 768), "bfloat16"),
)


default_problems = problems_from_shapes(problem_from_shape, INTERPRETER_SHAPES, GPU_SHAPES)


def bytes_moved(problem: Problem) -> int:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    return (2 * rows * cols + norm_params(problem) * cols) * element_bytes(str(problem["dtype"]))


flops = row_flops(4)


SPEC = norm_spec(
    __name__,
    name="rmsnorm",
    description="RMSNorm forward over the last dim of a 2-D tensor (fp32 statistics, optional weight)",
    **SHARED_DECLARATION,  # LayerNorm forward's space and tolerances (the same traffic, one ulp of rounding)
    version=1,
    # ~7 fp32 operations per element; looped reads x twice; the weight vector. The heuristic is LayerNorm's.
    model=forward_model(ops=7, looped_reads={"looped": 2}, params=norm_params),
)
