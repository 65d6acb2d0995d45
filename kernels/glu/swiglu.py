"""SwiGLU, the gated MLP activation of Llama, Qwen and Mistral, in one pass:

    y = silu(gate) * up,    silu(g) = g * sigmoid(g)

fp32 math, one rounding to the output dtype (fp16, bf16 or fp32). Where torch runs two ops (silu, then the product,
each a pass over memory and a rounding in the input dtype), the kernel reads gate and up once and writes y once.

sigmoid is built from e = exp(-|g|), which never overflows (on a GPU or in the interpreter): sigmoid(g) = 1/(1+e)
for g >= 0 and e/(1+e) below. NaN stays NaN, and silu(-inf) = -inf * 0 is NaN, as torch's silu gives.

The grid is row blocks x column blocks: program (i, j) computes rows [i * ROWS, ...) and columns
[j * BLOCK_N, ...) of the [M, N] view, masked at both edges (N of any size, 11008 or 4097 alike).

Inputs tuple: (gate, up), both [M, N] of one dtype, each with unit column stride and any row stride (a slice of a
fused gate/up projection is read in place). Outputs: (y,), a contiguous [M, N] tensor of their dtype.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tunekit.core.errors import InvalidShapeError
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    INT32_LIMIT,
    cdiv,
    check_shape,
    element_bytes,
    next_pow2,
    normal_sampler,
    op_kernel_spec,
    problems_from_shapes,
    row_flops,
    warps_for,
)
from tunekit.kernels.glu.perf_model import MODEL, STREAMS
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.glu.swiglu import MAX_COLS, MAX_COLUMN_TILES, MAX_ROWS, MIN_BLOCK_N, SPACE

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

# Offsets are int32 while every offset a launch forms (masked lanes included) stays below INT32_LIMIT; past it the
# kernel is compiled with int64 offsets. Read from this module's globals, so tests can force the int64 path.


@triton.jit
def _swiglu_kernel(
    G, U, Y,  # [M, N] each, unit column stride
    M, N, g_row, u_row, y_row,
    INT64: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row_block = tl.program_id(0)  # the grid's first axis has no 65535 limit: M may be large
    if INT64:
        row_block = row_block.to(tl.int64)
    rows = row_block * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    g = tl.load(G + (rows * g_row)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + (rows * u_row)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    e = tl.exp(-tl.abs(g))  # in (0, 1]; NaN for a NaN gate
    sig = tl.where(g >= 0.0, 1.0, e) / (1.0 + e)
    y = g * sig * u
    tl.store(Y + (rows * y_row)[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write y = silu(gate) * up. No validation: this is the hot path (the op validates)."""
    gate, up = inputs
    (y,) = outputs
    m, n = gate.shape
    if m == 0 or n == 0:
        return
    block_n, tile_rows = int(config["BLOCK_N"]), int(config["ROWS"])
    grid = (cdiv(m, tile_rows), cdiv(n, block_n))
    widest_row = max(gate.stride(0), up.stride(0), y.stride(0))
    largest = (grid[0] * tile_rows - 1) * widest_row + grid[1] * block_n  # bound on any offset a lane forms
    _swiglu_kernel[grid](
        gate, up, y, m, n, gate.stride(0), up.stride(0), y.stride(0),
        INT64=largest > INT32_LIMIT, ROWS=tile_rows, BLOCK_N=block_n, num_warps=int(config["num_warps"]),
    )  # fmt: skip


def alloc_outputs(inputs: Inputs) -> Outputs:
    gate = inputs[0]
    return (torch.empty(gate.shape, dtype=gate.dtype, device=gate.device),)


def torch_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """What a gated MLP writes without tunekit: torch's silu, then the product, in the input dtype."""
    return F.silu(gate) * up


def reference(inputs: Inputs) -> Outputs:
    """The formula in float64 with torch's silu, rounded once to gate's dtype."""
    gate, up = inputs
    return (torch_swiglu(gate.double(), up.double()).to(gate.dtype),)


def torch_baseline(inputs: Inputs) -> Outputs:
    gate, up = inputs
    return (torch_swiglu(gate, up),)


def swiglu_problem(rows: int, cols: int, dtype: str) -> Problem:
    """The problem of M = rows (the key the op builds, as a mapping)."""
    return {"rows": row_bucket(rows), "cols": cols, "dtype": dtype}


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    gate = (3.0 * randn(rows, cols)).to(dtype)  # spans silu's linear and saturating sides
    up = randn(rows, cols).to(dtype)
    return (gate, up)


SHAPE_USAGE = "a shape ...xN (rows x the MLP's intermediate size N), e.g. 4096x11008"


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("swiglu", shape, dtype, SHAPE_USAGE)
    if shape[-1] > MAX_COLS:
        raise InvalidShapeError(f"swiglu takes a last dim of at most {MAX_COLS}, but got {shape[-1]}")
    return swiglu_problem(math.prod(shape[:-1]), shape[-1], dtype)


def key_of(inputs: Inputs) -> ProblemKey:
    gate = inputs[0]
    m, n = gate.shape
    return (row_bucket(m), n, DTYPE_NAMES[gate.dtype])


_INTERPRETER_SHAPES = ((16, 256), (8, 1000), (1, 4097))
# Llama-2-7B (11008), Llama-3-8B and Mistral-7B (14336), Qwen2-7B (18944): decode, a small batch, prefill.
_GPU_SHAPES = (
    ((1, 11008), "bfloat16"),
    ((8, 14336), "bfloat16"),
    ((512, 18944), "bfloat16"),
    ((4096, 11008), "bfloat16"),
    ((4096, 14336), "bfloat16"),
    ((4096, 18944), "float16"),
    ((4096, 14336), "float32"),
)

default_problems = problems_from_shapes(problem_from_shape, _INTERPRETER_SHAPES, _GPU_SHAPES)


# Heuristic (not yet swept on a GPU for this kernel): the stream's, as measured for the pointwise kernel's `rows`
# layout on an H200 (kernels/pointwise/pointwise.py): about 2048 elements per program at a warp per 512, column
# tiles of the largest power of two dividing N up to 1024 where that is at least 256, else 256 (N = 11008, 4097).
# Programs are split (rows first) while there are fewer than PROGRAMS_PER_SM per SM and the tile stays at least
# MIN_TILE elements.
TARGET_TILE = 2048
MIN_TILE = 512
RAGGED_BLOCK_N = 256
MAX_HEURISTIC_BLOCK_N = 1024
PROGRAMS_PER_SM = 4


def _column_tile(cols: int) -> int:
    low = cols & -cols  # the largest power of two dividing cols: column tiles of it are never ragged
    block_n = min(low, MAX_HEURISTIC_BLOCK_N) if low >= RAGGED_BLOCK_N else min(RAGGED_BLOCK_N, next_pow2(cols))
    return max(block_n, MIN_BLOCK_N, next_pow2(cdiv(cols, MAX_COLUMN_TILES)))


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    block_n = _column_tile(cols)
    tile_rows = max(1, min(TARGET_TILE // block_n, next_pow2(rows), MAX_ROWS))
    wanted = PROGRAMS_PER_SM * device.sm_count
    while cdiv(rows, tile_rows) * cdiv(cols, block_n) < wanted and tile_rows * block_n > MIN_TILE:
        if tile_rows > 1:
            tile_rows //= 2
        else:
            block_n //= 2
    return {"BLOCK_N": block_n, "ROWS": tile_rows, "num_warps": warps_for(tile_rows * block_n, 16, 16)}


def bytes_moved(problem: Problem) -> int:
    """gate and up read, y written, once each."""
    return STREAMS * int(problem["rows"]) * int(problem["cols"]) * element_bytes(str(problem["dtype"]))


flops = row_flops(7)  # silu (exp counted as one, as the pointwise kernel's flops count it: 6) and the product


SPEC = op_kernel_spec(
    __name__,
    name="swiglu",
    description="Fused y = silu(gate) * up in one pass (the gated MLP of Llama, Qwen, Mistral)",
    space=SPACE,
    problem_fields=("rows", "cols", "dtype"),
    problem_values={"cols": range(1, MAX_COLS + 1)},
    # fp32: exp and the division differ from float64 by a few ulp. fp16/bf16: the kernel rounds once, as the
    # reference; torch's baseline rounds silu(gate) and the product (two roundings, within two ulps).
    tolerances=rounded_once(Tolerance(atol=1e-5, rtol=1e-5), float16_atol=1e-3, bfloat16_atol=1e-2),
    version=1,
    model=MODEL,
    shape_help=SHAPE_USAGE,
)
