"""Fused elementwise chain in one pass: y = act(x * scale + bias) + residual, fp32 math, any of fp16/bf16/fp32.

`act` is one of ACTIVATIONS (a constexpr flag: each activation compiles to its own kernel). The bias is
optional and broadcast over the last dim N of x; the residual is optional and has x's shape. Two layouts (its space
says more): `flat` streams x.numel() elements in 1-D runs and finds a bias by offs % N; `rows`
tiles the [M, N] view so a bias tile loads once per column tile.

Numerics. Every transcendental is built from exp of a non-positive argument, so nothing overflows (in CUDA or in
the interpreter) and inf/NaN propagate the way torch's do:
- sigmoid(t) = 1/(1+e) for t >= 0 and e/(1+e) for t < 0, with e = exp(-|t|).
- tanh: Cephes' tanhf (an odd polynomial below |v| = 0.625, (1-e)/(1+e) with e = exp(-2|v|) above): a few ulp
  everywhere, where 2*sigmoid(2v)-1 would lose all relative precision near 0.
- gelu_tanh: 0.5*v*(1 + tanh(k*(v + 0.044715*v³))) with k = sqrt(2/pi) equals v*sigmoid(2k*(v + 0.044715*v³))
  exactly (0.5*(1 + tanh(z)) = sigmoid(2z)); the sigmoid form keeps full relative precision in the negative tail,
  where 1 + tanh(z) cancels. It is torch's gelu(approximate='tanh'), the classic nine-op eager chain, fused.
- gelu: 0.5*v*(1 + erf(v/sqrt(2))), as torch computes it.

Inputs tuple: (x, bias, residual, scale, activation) with x contiguous [M, N] (the op views any tensor as
[-1, N]), bias a contiguous [N] tensor or None, residual a contiguous [M, N] tensor or None (bias and residual of
x's dtype), scale a Python float, activation a string of ACTIVATIONS. Outputs: (y,) of x's shape and dtype.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    INT32_LIMIT,
    check_shape,
    element_bytes,
    next_pow2,
    normal_sampler,
    op_kernel_spec,
    prev_pow2,
    torch_activation,
    warps_for,
)
from tunekit.kernels.pointwise.perf_model import ACTIVATION_OPS, MODEL
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.pointwise.pointwise import MIN_BLOCK, SPACE, problem_rows

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

# Offsets are int32 while every offset a launch can form (masked lanes included) stays below INT32_LIMIT; past it
# the kernel is compiled with int64 offsets. Read from this module's globals, so tests can force the int64 path on
# small tensors.

# gelu's 1/sqrt(2), and gelu_tanh's sigmoid-form coefficients: 2*sqrt(2/pi) and 2*sqrt(2/pi)*0.044715.
SQRT_HALF = tl.constexpr(math.sqrt(0.5))
GELU_TANH_K = tl.constexpr(2.0 * math.sqrt(2.0 / math.pi))
GELU_TANH_K3 = tl.constexpr(2.0 * math.sqrt(2.0 / math.pi) * 0.044715)


@triton.jit
def _sigmoid(t):
    e = tl.exp(-tl.abs(t))  # in (0, 1]: never overflows
    r = 1.0 / (1.0 + e)
    return tl.where(t >= 0.0, r, e * r)


@triton.jit
def _tanh(v):
    a = tl.abs(v)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)  # no cancellation for |v| >= 0.625 (e <= 0.29)
    big = tl.where(v < 0.0, -big, big)
    z = v * v
    p = (-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2
    p = (p * z + 1.33314422036e-1) * z - 3.33332819422e-1
    small = p * z * v + v
    return tl.where(a < 0.625, small, big)


@triton.jit
def _activate(v, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        v = tl.where(v < 0.0, 0.0, v)  # not max(v, 0): NaN must stay NaN, as in torch
    elif ACTIVATION == "gelu":
        v = 0.5 * v * (1.0 + tl.math.erf(v * SQRT_HALF))
    elif ACTIVATION == "gelu_tanh":
        v = v * _sigmoid(v * (GELU_TANH_K + GELU_TANH_K3 * v * v))
    elif ACTIVATION == "silu":
        v = v * _sigmoid(v)
    elif ACTIVATION == "sigmoid":
        v = _sigmoid(v)
    elif ACTIVATION == "tanh":
        v = _tanh(v)
    return v


@triton.jit
def _pointwise_flat(
    X,  # [numel] input, contiguous
    B,  # [N] bias (read only when HAS_BIAS)
    R,  # [numel] residual (read only when HAS_RESIDUAL)
    Y,  # [numel] output, contiguous
    numel, N, scale,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INT64: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * BLOCK if INT64 else pid * BLOCK
    idx = tl.arange(0, BLOCK)
    offs = start + idx
    mask = offs < numel
    v = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32) * scale
    if HAS_BIAS:
        # One scalar modulo per program, then a small one per element (start % N + idx < N + BLOCK).
        col = (start % N + idx) % N
        v += tl.load(B + col, mask=mask, other=0.0).to(tl.float32)
    v = _activate(v, ACTIVATION)
    if HAS_RESIDUAL:
        v += tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, v.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _pointwise_rows(
    X,  # [M, N] input, contiguous
    B,  # [N] bias (read only when HAS_BIAS)
    R,  # [M, N] residual, contiguous (read only when HAS_RESIDUAL)
    Y,  # [M, N] output, contiguous
    M, N, n_col_tiles, scale,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # A 1-D grid, column tiles fastest: neighbouring programs touch neighbouring memory, and no grid axis limit.
    pid = tl.program_id(0)
    pid_m = pid // n_col_tiles
    pid_n = pid % n_col_tiles
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    row_index = rows.to(tl.int64) if INT64 else rows
    offs = row_index[:, None] * N + cols[None, :]
    v = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32) * scale
    if HAS_BIAS:
        b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
        v += b[None, :]
    v = _activate(v, ACTIVATION)
    if HAS_RESIDUAL:
        v += tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, v.to(Y.dtype.element_ty), mask=mask)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write y = act(x * scale + bias) + residual. No validation: this is the hot path (the op validates)."""
    x, bias, residual, scale, activation = inputs
    (y,) = outputs
    numel = x.numel()
    if numel == 0:
        return
    n = x.shape[-1] if x.dim() > 0 else 1
    block = int(config["BLOCK"])
    # An absent bias or residual still needs a pointer argument; the constexpr flag keeps it unread.
    common = {
        "ACTIVATION": activation,
        "HAS_BIAS": bias is not None,
        "HAS_RESIDUAL": residual is not None,
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    b = x if bias is None else bias
    r = x if residual is None else residual
    if config["variant"] == "rows":
        block_n = int(config["BLOCK_N"])
        block_m = block // block_n
        m = numel // n
        n_col_tiles = triton.cdiv(n, block_n)
        grid_m = triton.cdiv(m, block_m)
        largest = (grid_m * block_m) * n + n_col_tiles * block_n  # bound on any offset a lane forms
        _pointwise_rows[(grid_m * n_col_tiles,)](
            x, b, r, y, m, n, n_col_tiles, float(scale),
            INT64=largest > INT32_LIMIT, BLOCK_M=block_m, BLOCK_N=block_n, **common,
        )  # fmt: skip
    else:
        grid = triton.cdiv(numel, block)
        _pointwise_flat[(grid,)](
            x, b, r, y, numel, n, float(scale),
            INT64=grid * block + n > INT32_LIMIT, BLOCK=block, **common,
        )  # fmt: skip


def alloc_outputs(inputs: Inputs) -> Outputs:
    return (torch.empty_like(inputs[0]),)


def reference(inputs: Inputs) -> Outputs:
    """The same chain in float64 with torch's own activations, rounded once to x's dtype."""
    x, bias, residual, scale, activation = inputs
    v = x.double() * scale
    if bias is not None:
        v = v + bias.double()
    v = torch_activation(v, activation)
    if residual is not None:
        v = v + residual.double()
    return (v.to(x.dtype),)


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user writes without tunekit: one eager torch op per step, in the input dtype."""
    x, bias, residual, scale, activation = inputs
    v = x * scale if scale != 1.0 else x
    if bias is not None:
        v = v + bias
    v = torch_activation(v, activation)
    return (v + residual if residual is not None else v,)


def pointwise_problem(
    numel: int,
    cols: int,
    dtype: str,
    activation: str = "gelu_tanh",
    has_bias: bool = True,
    has_residual: bool = False,
) -> Problem:
    """The problem of an x with `numel` elements and last dim `cols` (the key the ops build, as a mapping)."""
    cols = cols if has_bias else 0
    return {
        "numel": row_bucket(numel),
        "cols": cols,
        "aligned16": cols % 16 == 0,
        "dtype": dtype,
        "activation": activation,
        "has_bias": has_bias,
        "has_residual": has_residual,
    }


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    numel, cols, dtype = int(problem["numel"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    # With a bias, whole rows of `cols` filling at most the bucket (so the bucket of x.numel() is `numel`).
    shape = (max(1, numel // cols), cols) if cols > 0 else (1, numel)
    randn = normal_sampler(device, seed)
    # x spans the saturating tails of every activation; scale 0.5 catches a kernel that ignores it.
    x = (3.0 * randn(*shape)).to(dtype)
    bias = (0.5 * randn(cols) + 0.25).to(dtype) if problem["has_bias"] else None
    residual = randn(*shape).to(dtype) if problem["has_residual"] else None
    return (x, bias, residual, 0.5, str(problem["activation"]))


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    usage = "a shape N (one flat tensor) or ...xN (a bias over N), e.g. 134217728 or 8192x4096"
    check_shape("pointwise", shape, dtype, usage)
    return pointwise_problem(math.prod(shape), shape[-1], dtype, "gelu_tanh", has_bias=len(shape) > 1)


def key_of(inputs: Inputs) -> ProblemKey:
    """x is [M, N] ([-1, N] of the op's input); without a bias the kernel streams x flat: N does not matter."""
    x, bias, residual, _, activation = inputs
    cols = x.shape[-1] if bias is not None else 0
    dtype = DTYPE_NAMES[x.dtype]
    return (row_bucket(x.numel()), cols, cols % 16 == 0, dtype, activation, bias is not None, residual is not None)


def _interpreter_problems() -> list[Problem]:
    return [
        pointwise_problem(4096, 4096, "float32", "gelu_tanh", has_bias=False),
        pointwise_problem(64 * 96, 96, "float32", "gelu"),
        pointwise_problem(32 * 48, 48, "float32", "silu", has_residual=True),
    ]


def _gpu_problems() -> list[Problem]:
    return [
        pointwise_problem(1 << 27, 1 << 27, "float32", "gelu_tanh", has_bias=False),  # the headline
        pointwise_problem(1 << 26, 1 << 26, "bfloat16", "gelu_tanh", has_bias=False),
        pointwise_problem(8192 * 4096, 4096, "bfloat16", "gelu"),
        pointwise_problem(16384 * 1024, 1024, "float16", "silu", has_residual=True),
        pointwise_problem(4096 * 11008, 11008, "bfloat16", "silu"),
        pointwise_problem(8192 * 4097, 4097, "float16", "gelu_tanh"),  # a row length no vector divides
    ]


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: keep its set small enough to tune in seconds.
    return _interpreter_problems() if device.is_interpreter else _gpu_problems()


# Measured on an H200 (Triton 3.6, the GPU default problems): 2048 elements per program at 4 warps is within
# ~2% of the best of BLOCK 1024..16384 x 1..16 warps on 2**24..2**27-element streams (~0.98 of copy bandwidth
# for fp32 gelu_tanh). With a bias, `rows` beat `flat` by 1.5-1.8x, even on rows of 4097: flat's per-element
# modulo and scalar bias gather cost more than unvectorised or ragged rows.
TARGET_BLOCK = 2048
ROWS_BLOCK_N = 256  # column tile when cols has no power-of-two factor of at least this (best for 4097, 11008)
MAX_ROWS_BLOCK_N = 1024
MIN_ROWS_COLS = 16  # narrower rows leave most lanes of a 16-wide column tile masked off: flat is cheaper


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    numel = int(problem["numel"])
    block = min(TARGET_BLOCK, max(MIN_BLOCK, next_pow2(numel)))
    if device.sm_count > 0:  # at least four programs per SM when the problem is large enough for that
        block = min(block, max(MIN_BLOCK, prev_pow2(numel // (4 * device.sm_count))))
    cols = int(problem["cols"])
    if problem["has_bias"] and cols >= MIN_ROWS_COLS:
        low = cols & -cols  # the largest power of two dividing cols: column tiles of it are never ragged
        if problem["aligned16"] and low >= ROWS_BLOCK_N:
            block_n = min(low, MAX_ROWS_BLOCK_N, block)
        else:
            block_n = min(ROWS_BLOCK_N, next_pow2(cols), block)
        block_m = min(block // block_n, next_pow2(problem_rows(problem)))
        if block_n * block_m >= MIN_BLOCK:
            rows_block = block_n * block_m
            return {
                "variant": "rows",
                "BLOCK": rows_block,
                "BLOCK_N": block_n,
                "num_warps": warps_for(rows_block, 16, 8),  # a warp per 512 elements
                "num_stages": 1,
            }
    return {"variant": "flat", "BLOCK": block, "BLOCK_N": block, "num_warps": warps_for(block, 16, 8), "num_stages": 1}


# Rough fp32 operations per element of each activation (exp/erf counted as one): for the flops column only (the
# model's estimates, kernels/pointwise/perf_model.py, count instructions).
_ACTIVATION_FLOPS = {"none": 0, "relu": 1, "gelu": 5, "gelu_tanh": 8, "silu": 6, "sigmoid": 5, "tanh": 10}


def bytes_moved(problem: Problem) -> int:
    numel, size = int(problem["numel"]), element_bytes(str(problem["dtype"]))
    streams = 2 + int(bool(problem["has_residual"]))  # x read, y written, residual read
    return (streams * numel + int(problem["cols"])) * size


def flops(problem: Problem) -> int:
    per_element = 1 + _ACTIVATION_FLOPS[str(problem["activation"])]
    per_element += int(bool(problem["has_bias"])) + int(bool(problem["has_residual"]))
    return per_element * int(problem["numel"])


SPEC = op_kernel_spec(
    __name__,
    name="pointwise",
    description="Fused y = act(x * scale + bias) + residual in one pass (relu, gelu, gelu_tanh, silu, ...)",
    space=SPACE,
    problem_fields=("numel", "cols", "aligned16", "dtype", "activation", "has_bias", "has_residual"),
    problem_values={"cols": range(0, 2**40), "activation": tuple(ACTIVATION_OPS)},  # cols 0: no bias (flat)
    # fp16/bf16: both sides round a value to the output dtype once. fp32: exp and erf differ from float64 by a
    # few ulp, and 1 + erf(v) cancels in gelu's negative tail (abs error ~1e-7 * |v|).
    tolerances=rounded_once(Tolerance(atol=1e-5, rtol=1e-5), float16_atol=1e-3, bfloat16_atol=1e-2),
    version=1,
    model=MODEL,
    shape_help=(
        "N (one flat tensor, no bias) or ...xN (bias over the last dim N), e.g. 134217728 or 8192x4096; "
        "activation gelu_tanh, no residual"
    ),
)
