"""RMSNorm forward over the last dim of a 2-D tensor: y = x * rsqrt(mean(x²) + eps) * w.

fp32 statistics. Three variants, as the LayerNorm forward (kernels/layernorm.py) and sharing its search space:
`single` keeps ROWS whole rows in registers and reads x once; `looped` walks one row in BLOCK_N chunks, reading x
twice (sum of squares, then normalise); `window` is `single` through 16-byte aligned windows for rows that start
inside a vector (kernels/row_window.py).

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.backend  # noqa: F401

# isort: split

import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from tunekit.errors import InvalidInputError, InvalidShapeError
from tunekit.kernels.row_window import row_window, row_window_load, store_row_window, window_fits
from tunekit.search_spaces.rmsnorm import MAX_CHUNKS, SPACE, next_pow2, single_block_n
from tunekit.search_spaces.row_window import vector_elements
from tunekit.space import Config, Problem
from tunekit.spec import DTYPE_NAMES, DTYPES, Inputs, KernelSpec, Outputs, Tolerance, row_bucket

if TYPE_CHECKING:
    from tunekit.device import DeviceFingerprint

DEFAULT_EPS = 1e-6


@triton.jit
def _rmsnorm_fwd_single(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    W,  # [N] weight (read only when HAS_WEIGHT)
    M,
    N,
    stride_x,
    stride_y,
    eps,
    HAS_WEIGHT: tl.constexpr,
    DIV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    # Triton only learns that a size is a multiple of 16; DIV, a power of two the host found dividing N and both
    # strides, restores 16-byte vector loads for rows like 3000 fp16 values (as in kernels/layernorm.py).
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
    N,
    stride_x,
    stride_y,
    eps,
    HAS_WEIGHT: tl.constexpr,
    DIV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
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
    M,
    N,
    stride,
    eps,
    HAS_WEIGHT: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
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
    g = math.gcd(n, x.stride(0), y.stride(0), 16)  # DIV = g & -g: the largest power of two dividing all, <= 16
    common = {
        "HAS_WEIGHT": weight is not None,
        "DIV": g & -g,
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


def torch_baseline(inputs: Inputs) -> torch.Tensor:
    """What a user runs today: torch's RMSNorm in the input dtype."""
    x, weight, eps = inputs
    return torch.nn.functional.rms_norm(x, (x.shape[1],), weight, eps)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    # An offset mean catches a kernel that subtracts one; weights near 1 keep y O(1).
    x = (randn(rows, cols) * 2.0 + 0.5).to(dtype)
    weight = (1.0 + 0.1 * randn(cols)).to(dtype) if problem["weight"] else None
    return (x, weight, DEFAULT_EPS)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    if len(shape) != 2:
        raise InvalidShapeError(f"rmsnorm takes a 2-D shape MxN (e.g. 4096x1024), but got {len(shape)}-D {shape}")
    m, n = shape
    if m < 1 or n < 1:
        raise InvalidShapeError(f"rmsnorm shape sizes must be >= 1, but got {m}x{n}")
    if dtype not in DTYPES:
        raise InvalidInputError(f"rmsnorm dtype must be one of {sorted(DTYPES)}, but got {dtype!r}")
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": True}


_INTERPRETER_SHAPES = ((16, 256), (8, 1000), (4, 4097))
_GPU_SHAPES = (
    ((16384, 1024), "float16"),
    ((4096, 4096), "bfloat16"),
    ((4096, 4097), "float16"),
    ((2048, 8192), "bfloat16"),
    ((1024, 25600), "float16"),
    ((65536, 768), "bfloat16"),
)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: keep its set small enough to tune in seconds.
    if device.is_interpreter:
        return [problem_from_shape(s, "float32") for s in _INTERPRETER_SHAPES]
    return [problem_from_shape(s, dtype) for s, dtype in _GPU_SHAPES]


# Heuristic constants: the LayerNorm forward's, swept on an H200 (kernels/layernorm.py), for the same space and
# the same memory traffic; not yet swept for RMSNorm itself.
SINGLE_MAX_BLOCK_N = 16384
TARGET_TILE = 2048
PER_THREAD = 16
LOOPED_BLOCK_N = 4096
FEW_ROWS_BLOCK_N = 16384


def _warps_for(elements: int, per_thread: int, most: int) -> int:
    return min(most, max(1, elements // (32 * per_thread)))


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _looped(block_n: int, warps: int) -> Config:
    return {"variant": "looped", "BLOCK_N": block_n, "ROWS": 1, "num_warps": warps, "num_stages": 1}


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    itemsize = DTYPES[str(problem["dtype"])].itemsize
    width = single_block_n(cols)
    if cols * itemsize % 16 and cols >= 2048:
        # Rows not starting on 16 bytes load element by element: short chunks keep the most loads in flight.
        block_n = min(LOOPED_BLOCK_N, max(512, next_pow2(cols) // MAX_CHUNKS))
        return _looped(block_n, _warps_for(block_n * itemsize, 8, 32))
    if width <= SINGLE_MAX_BLOCK_N:
        per_program = max(2, TARGET_TILE // width) if width < SINGLE_MAX_BLOCK_N else 1
        if device.sm_count > 0:  # keep at least two programs per SM
            per_program = min(per_program, _prev_pow2(rows // (2 * device.sm_count)))
        per_program = min(per_program, _prev_pow2(rows), 64)
        return {
            "variant": "single",
            "BLOCK_N": width,
            "ROWS": per_program,
            "num_warps": _warps_for(per_program * width, PER_THREAD, 16),
            "num_stages": 1,
        }
    if 0 < rows < device.sm_count:  # fewer rows than SMs: each program gets a whole SM's worth of warps
        return _looped(FEW_ROWS_BLOCK_N, 32)
    return _looped(LOOPED_BLOCK_N, 16)


def bytes_moved(problem: Problem) -> int:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    size = DTYPES[str(problem["dtype"])].itemsize
    return (2 * rows * cols + int(bool(problem["weight"])) * cols) * size


def flops(problem: Problem) -> int:
    return 4 * int(problem["rows"]) * int(problem["cols"])


SPEC = KernelSpec(
    name="rmsnorm",
    description="RMSNorm forward over the last dim of a 2-D tensor (fp32 statistics, optional weight)",
    space=SPACE,
    problem_fields=("rows", "cols", "dtype", "weight"),
    launch=launch,
    alloc_outputs=alloc_outputs,
    reference=reference,
    make_inputs=make_inputs,
    problem_from_shape=problem_from_shape,
    default_problems=default_problems,
    heuristic=heuristic,
    # As the LayerNorm forward: fp32 differs from torch by ~1e-6 relative; fp16/bf16 outputs by one ulp at most.
    tolerances={
        "float32": Tolerance(atol=1e-4, rtol=1e-4),
        "float16": Tolerance(atol=1e-2, rtol=1e-2),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
    bytes_moved=bytes_moved,
    flops=flops,
    version=1,
    shape_help="MxN, e.g. 4096x1024",
    torch_baseline=torch_baseline,
)
