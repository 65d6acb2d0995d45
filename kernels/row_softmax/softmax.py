"""Softmax and log_softmax over the last dim of a 2-D tensor, fp32 math, LOG as a constexpr flag.

Three variants (see search_spaces/row_softmax/softmax.py): `single` keeps ROWS whole rows in registers (one read);
`online` walks one row in BLOCK_N chunks keeping a per-lane running max and rescaled sum (two reads);
`looped` walks it three times (max, sum, write). Exponentials are exp2 of differences scaled by
log2(e) = 1.4426950408889634 (written as a literal: a plain Python global is not visible inside @triton.jit).

Edge cases match torch: a row of all -inf gives NaN (0/0), a NaN anywhere in a row makes the whole row NaN (it
reaches the sum through its exponential), +inf gives NaN. Padding lanes load -inf, whose exponential is 0.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# isort: off
import tunekit.core.backend  # noqa: F401  (before triton: it selects the interpreter without a GPU)

# isort: on
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    check_shape,
    element_bytes,
    next_pow2,
    normal_sampler,
    op_kernel_spec,
    prev_pow2,
    row_flops,
    vector_elements,
    warps_for,
)
from tunekit.kernels.row_window import row_window, row_window_load, store_row_window, window_fits
from tunekit.kernels.rows_perf_model import forward_model
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.row_softmax.softmax import SPACE
from tunekit.search_spaces.rows import MAX_BLOCK_ELEMENTS, MAX_CHUNKS, single_block_n

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint


@triton.jit
def _softmax_single(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    M, N, stride_x, stride_y,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    # int64 row offsets: M * N may exceed 2**31 elements.
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=1)[:, None]
    e = tl.exp2(z * 1.4426950408889634)
    total = tl.sum(e, axis=1)
    y = z - tl.log(total)[:, None] if LOG else e * (1.0 / total)[:, None]
    tl.store(Y + rows64 * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_window(
    X,  # [M, N] input, unit stride along N, 16-byte aligned
    Y,  # [M, N] output, same strides as X, 16-byte aligned
    M, N, stride,
    LOG: tl.constexpr, VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    offs, _, in_row, chunk_in, chunk_full, last = row_window(M, N, stride, VEC, BLOCK_N, ROWS)
    x = tl.where(in_row, row_window_load(X, offs, in_row, chunk_in, last), float("-inf"))
    z = x - tl.max(x, axis=1)[:, None]
    e = tl.exp2(z * 1.4426950408889634)
    total = tl.sum(e, axis=1)
    y = z - tl.log(total)[:, None] if LOG else e * (1.0 / total)[:, None]
    store_row_window(Y, offs, y.to(Y.dtype.element_ty), in_row, chunk_full)


@triton.jit
def _softmax_write(x_row, y_row, N, row_max, total, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """Last pass of the looped variants: y = softmax or log_softmax of the row, last chunk first (likely cached)."""
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    log_total = tl.log(total)
    inv_total = 1.0 / total
    for k in tl.range(0, n_chunks):
        offs = (n_chunks - 1 - k) * BLOCK_N + cols
        mask = offs < N
        z = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32) - row_max
        y = z - log_total if LOG else tl.exp2(z * 1.4426950408889634) * inv_total
        tl.store(y_row + offs, y.to(y_row.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    N, stride_x, stride_y,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    cols = tl.arange(0, BLOCK_N)
    # Per lane: the running max and the sum of exp(x - running max), rescaled whenever the max grows.
    lane_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        # A lane that has seen only -inf keeps sum 0 (exp(-inf - -inf) would be NaN).
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp2((lane_max - shift) * 1.4426950408889634) + tl.exp2(
            (x - shift) * 1.4426950408889634
        )
        lane_max = new_max
    row_max = tl.max(lane_max, axis=0)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(lane_sum * tl.exp2((lane_max - shift) * 1.4426950408889634), axis=0)
    _softmax_write(x_row, Y + row * stride_y, N, row_max, total, LOG, BLOCK_N)


@triton.jit
def _softmax_looped(
    X,  # [M, N] input, unit stride along N
    Y,  # [M, N] output, unit stride along N
    N, stride_x, stride_y,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    cols = tl.arange(0, BLOCK_N)
    lane_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
        lane_max = tl.maximum(lane_max, x)
    row_max = tl.max(lane_max, axis=0)
    lane_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
        lane_sum += tl.exp2((x - row_max) * 1.4426950408889634)
    total = tl.sum(lane_sum, axis=0)
    _softmax_write(x_row, Y + row * stride_y, N, row_max, total, LOG, BLOCK_N)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write y = softmax(x) (log_softmax when `log`) over the last dim of a 2-D x with unit stride along N.

    inputs = (x, log); outputs = (y,), y [M, N] with unit stride along N, of any float dtype (the result's).
    No validation: this is the hot path.
    """
    x, log = inputs
    (y,) = outputs
    m, n = x.shape
    if m == 0 or n == 0:
        return
    block_n = int(config["BLOCK_N"])
    options = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    variant = config["variant"]
    if variant == "window" and window_fits(x, y):
        rows, vec = int(config["ROWS"]), vector_elements(DTYPE_NAMES[x.dtype])
        _softmax_window[(triton.cdiv(m, rows),)](
            x, y, m, n, x.stride(0), LOG=bool(log), VEC=vec, BLOCK_N=block_n, ROWS=rows, **options
        )
    elif variant in ("single", "window"):  # window on tensors it cannot take: the same rows, plain loads
        rows = int(config["ROWS"])
        block_n = single_block_n(n)
        _softmax_single[(triton.cdiv(m, rows),)](
            x, y, m, n, x.stride(0), y.stride(0), LOG=bool(log), BLOCK_N=block_n, ROWS=rows, **options
        )
    elif variant == "online":
        _softmax_online[(m,)](x, y, n, x.stride(0), y.stride(0), LOG=bool(log), BLOCK_N=block_n, **options)
    else:
        _softmax_looped[(m,)](x, y, n, x.stride(0), y.stride(0), LOG=bool(log), BLOCK_N=block_n, **options)


def alloc_outputs(inputs: Inputs) -> Outputs:
    return (torch.empty_like(inputs[0]),)


def reference(inputs: Inputs) -> Outputs:
    x, log = inputs
    fn = torch.log_softmax if log else torch.softmax
    return (fn(x.double(), dim=-1).to(x.dtype),)


def torch_softmax(inputs: Inputs, outputs: Outputs) -> None:
    """torch's own softmax (log_softmax) over the last dim into the output the kernel would have written: what
    tunekit.ops runs where dispatch serves torch (the aten op torch.softmax calls, with an out= tensor)."""
    x, log = inputs
    (y,) = outputs
    (torch.ops.aten._log_softmax.out if log else torch.ops.aten._softmax.out)(x, -1, False, out=y)


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs without tunekit: torch's softmax (log_softmax) over the last dim, in the input dtype."""
    outputs = alloc_outputs(inputs)
    torch_softmax(inputs, outputs)
    return outputs


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    # A spread of 3 makes the row max matter (exp overflows without it); an offset catches a lost max shift.
    x = normal_sampler(device, seed)(rows, cols) * 3.0 + 2.0
    return (x.to(dtype), bool(problem["log"]))


def problem(shape: tuple[int, int], dtype: str, log: bool = False) -> Problem:
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "log": log}


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("softmax", shape, dtype, "a 2-D shape MxN (softmax over N, e.g. 8192x4096)", (2,))
    m, n = shape
    return problem((m, n), dtype)


def key_of(inputs: Inputs) -> ProblemKey:
    x, log = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], log)


_INTERPRETER_PROBLEMS = (((32, 1000), "float32", False), ((8, 3000), "float32", True), ((64, 33), "float16", False))
_GPU_PROBLEMS = (
    ((8192, 4096), "float16", False),
    ((4096, 32768), "bfloat16", False),
    ((8192, 4096), "float16", True),
    ((4096, 32768), "bfloat16", True),
    ((65536, 1024), "bfloat16", False),
    ((32768, 128), "float16", False),
    ((4096, 4097), "float32", False),
    ((1024, 131072), "float32", False),
    ((2048, 50257), "bfloat16", True),
)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: keep its set small enough to tune in well under a minute.
    chosen = _INTERPRETER_PROBLEMS if device.is_interpreter else _GPU_PROBLEMS
    return [problem(*p) for p in chosen]


SINGLE_MAX_BLOCK_N = 32768  # a whole row in registers up to here (32 fp32 values per thread at 32 warps)
LOOPED_BLOCK_N = 4096
TARGET_TILE = 4096  # elements per program when several short rows share one


def _warps(tile: int) -> int:
    """Triton tutorial's rule (a warp per 256 elements, at most 8), raised until no thread holds over 32."""
    return max(warps_for(tile, 8, 8), warps_for(tile, 32, 32))


def single_rows_config(rows: int, width: int, device: DeviceFingerprint) -> Config:
    """The `single` variant's config: whole rows of `width` in registers, short rows sharing a program up to
    TARGET_TILE elements while every SM keeps at least two programs (softmax and cross-entropy alike)."""
    per_program = max(1, TARGET_TILE // width)
    if device.sm_count > 0:  # keep at least two programs per SM
        per_program = min(per_program, prev_pow2(rows // (2 * device.sm_count)))
    per_program = min(per_program, rows, 64)
    return {
        "variant": "single",
        "BLOCK_N": width,
        "ROWS": per_program,
        "num_warps": _warps(per_program * width),
        "num_stages": 1,
    }


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    width = single_block_n(cols)
    if width <= SINGLE_MAX_BLOCK_N:
        return single_rows_config(rows, width, device)
    # Wide rows: 32 warps per row. Fewer rows in flight per SM keep each row's second read in L2 (measured on an
    # H200: 2048x50257 and 1024x131072 ran 3-8% faster than with 8 warps).
    block_n = min(MAX_BLOCK_ELEMENTS, max(LOOPED_BLOCK_N, next_pow2(cols) // MAX_CHUNKS))
    return {"variant": "online", "BLOCK_N": block_n, "ROWS": 1, "num_warps": 32, "num_stages": 1}


def bytes_moved(problem: Problem) -> int:
    return 2 * int(problem["rows"]) * int(problem["cols"]) * element_bytes(str(problem["dtype"]))


flops = row_flops(5)


SPEC = op_kernel_spec(
    __name__,
    name="softmax",
    description="softmax / log_softmax over the last dim of a 2-D tensor (fp32 math; single, online, looped)",
    space=SPACE,
    problem_fields=("rows", "cols", "dtype", "log"),
    # Softmax values lie in [0, 1], log_softmax values are O(-10..0). fp32: exp2/log approximations and
    # summation order differ from the fp64 reference by ~1e-6 relative. fp16/bf16: one rounding of the result;
    # atol covers fp16 subnormals of tiny probabilities.
    tolerances=rounded_once(Tolerance(atol=1e-6, rtol=1e-4), float16_atol=1e-5, bfloat16_atol=1e-4),
    version=1,
    shape_help="MxN (softmax over the last dim N), e.g. 8192x4096",
    # ~8 fp32 operations per element; online reads x twice, looped three times; no parameter vectors.
    model=forward_model(ops=8, looped_reads={"online": 2, "looped": 3}, params=lambda problem: 0),
)
