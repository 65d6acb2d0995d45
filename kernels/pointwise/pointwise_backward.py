"""Backward of the fused pointwise op y = act(input * scale + bias) + residual: d_input and d_bias in one pass.

With z = input * scale + bias (fp32, as the forward computes it) and dz = grad * act'(z):

    d_input = dz * scale  (input's dtype),    d_bias = Σ_rows dz  (bias's dtype; when wanted)

d_residual is grad itself: no kernel. One kernel reads grad and input once and writes d_input; d_bias never takes
a second pass over them. Input is viewed as [M, N] (N its last dim, the bias length) and tiled into [ROWS, BLOCK_N]
tiles; BLOCK_N need not cover a row (wide rows get several column tiles).

With a bias the grid is persistent, as LayerNorm backward's (kernels/norms/layernorm_backward.py): each column tile has
`row_programs` programs (PROGRAMS_PER_SM × SMs in all, see its space), program p of a column
tile takes its row tiles p, p + row_programs, ... and keeps its d_bias sums in fp32 registers for the whole run,
then writes ONE partial row of a workspace [row_programs, N]; LayerNorm backward's `_sum_partials` adds those
rows in a fixed order. No atomics: the result is bitwise repeatable for a config on a device. Without a bias
nothing is summed: the kernel sees the flat tensor as one row of numel elements, one program per BLOCK_N of them
(a plain elementwise grid, the fastest stream; the forward's `flat` layout reaches ~0.98 of copy so).
The next tile's grad and input are loaded before this tile's math (a register double buffer, evict-first: read
once), as LayerNorm backward's `_norm_bwd_single` does; there it measured 1.3x on an H200.

Derivatives, in fp32 from the forward's constants (pointwise.py); every exp has a non-positive argument:
- relu: grad where z > 0 or z is NaN, else 0 (torch's threshold_backward: NaN passes the gradient through).
- gelu: 0.5 * (1 + erf(z / sqrt(2))) + z * exp(-z²/2) / sqrt(2pi).
- gelu_tanh: the forward is z * sigmoid(u), u = K z + K3 z³, so the derivative is s + z * s(1-s) * (K + 3 K3 z²).
- silu: s + z * s(1-s); sigmoid: s(1-s); tanh: 1 - tanh² = 4 s(1-s) at 2z.
s(1-s) is e/(1+e)² with e = exp(-|t|), from the same exp as s: 1 - s, or 1 - tanh², would cancel where s nears 1
(the forward's `_sigmoid` returns s alone, so the derivatives take both from `_sigmoid_slope`).

Inputs tuple: (input, grad, bias | None, want_dbias, activation, scale), LayerNorm backward's order (x, dy, ...):
input and grad contiguous of one shape and dtype (any rank; the last dim is N), bias a contiguous [N] tensor or
None, want_dbias a bool (ignored without a bias), activation a string of ACTIVATIONS, scale a Python float.
Outputs: (d_input,) or (d_input, d_bias) when a bias is given and wanted.

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

from tunekit.core.device import fingerprint
from tunekit.core.geometry import Geometry, KernelModel, TileDim, estimate_registers
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    FP32_BYTES,
    INT32_LIMIT,
    cdiv,
    check_shape,
    element_bytes,
    normal_sampler,
    op_kernel_spec,
    pow2_divisor,
    torch_activation,
)
from tunekit.kernels.persistent import SUM_BLOCK_G, SUM_BLOCK_N, SUM_WARPS, TILING, _sum_partials, autograd_baseline
from tunekit.kernels.pointwise.perf_model import ACTIVATION_OPS
from tunekit.kernels.pointwise.pointwise import heuristic as pointwise_heuristic
from tunekit.kernels.pointwise.pointwise import pointwise_problem
from tunekit.kernels.pointwise.pointwise_backward_jit import (
    _pointwise_bwd,
)
from tunekit.kernels.rows_perf_model import BACKWARD_REGISTERS_PER_ELEMENT, WORKSPACE_SMS, row_size_classes
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.norms.layernorm_backward import MAX_BLOCK_N, MAX_PROGRAMS_PER_SM, launch_sms
from tunekit.search_spaces.pointwise.pointwise_backward import SPACE, row_programs
from tunekit.search_spaces.rows import single_block_n

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """inputs (input, grad, bias | None, want_dbias, activation, scale); outputs (d_input, [d_bias]).
    No validation: this is the hot path (the op validates)."""
    x, dy, bias, _, activation, scale = inputs
    dx = outputs[0]
    db = outputs[1] if len(outputs) > 1 else None
    numel = x.numel()
    if numel == 0:
        if db is not None:
            db.zero_()  # a sum over no rows
        return
    n = x.shape[-1] if bias is not None else numel  # without a bias: one row of numel elements
    m = numel // n
    block_n, tile_rows = int(config["BLOCK_N"]), int(config["ROWS"])
    col_tiles = triton.cdiv(n, block_n)
    per_col_tile = row_programs(config, m, n, fingerprint(x.device.index).sm_count)
    # One fp32 partial row per program of a column tile; every element the sum kernel reads is written first. An
    # unwanted workspace is a placeholder pointer, never touched (as an absent bias).
    db_part = torch.empty((per_col_tile, n), dtype=torch.float32, device=x.device) if db is not None else dx
    largest = (triton.cdiv(m, tile_rows) + per_col_tile) * tile_rows * n + col_tiles * block_n  # prefetch included
    _pointwise_bwd[(col_tiles * per_col_tile,)](
        dy, x, x if bias is None else bias, dx, db_part, m, n, col_tiles, float(scale),
        ACTIVATION=activation, HAS_BIAS=bias is not None, WANT_DB=db is not None, INT64=largest > INT32_LIMIT,
        DIV=pow2_divisor(n), BLOCK_N=block_n, ROWS=tile_rows,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )  # fmt: skip
    if db is not None:
        _sum_partials[(triton.cdiv(n, SUM_BLOCK_N),)](
            db_part, db_part, db, db, per_col_tile, n,
            WANT_DW=False, WANT_DB=True, DIV=pow2_divisor(n), BLOCK_G=SUM_BLOCK_G, BLOCK_N=SUM_BLOCK_N,
            num_warps=SUM_WARPS,
        )  # fmt: skip


def _wants_dbias(inputs: Inputs) -> bool:
    return inputs[2] is not None and bool(inputs[3])


def alloc_outputs(inputs: Inputs) -> Outputs:
    x, bias = inputs[0], inputs[2]
    return (torch.empty_like(x), torch.empty_like(bias)) if _wants_dbias(inputs) else (torch.empty_like(x),)


def _forward(
    x: torch.Tensor, bias: torch.Tensor | None, want_db: bool, activation: str, scale: float
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torch's op chain on leaves made of x and bias (bias a leaf when its gradient is wanted): (y, leaves)."""
    xr = x.detach().requires_grad_()
    z = xr * scale if scale != 1.0 else xr
    leaves = [xr]
    if bias is not None:
        br = bias.detach().requires_grad_(want_db)
        z = z + br
        leaves += [br] if want_db else []
    return torch_activation(z, activation), leaves


def reference(inputs: Inputs) -> Outputs:
    """torch autograd on float64 copies, cast back to the outputs' dtypes."""
    x, dy, bias, _, activation, scale = inputs
    y, leaves = _forward(x.double(), None if bias is None else bias.double(), _wants_dbias(inputs), activation, scale)
    grads = torch.autograd.grad(y, leaves, dy.double())
    dtypes = [x.dtype] + ([bias.dtype] if len(leaves) > 1 else [])
    return tuple(g.to(d) for g, d in zip(grads, dtypes))


def _torch_forward(inputs: Inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x, _, bias, _, activation, scale = inputs
    return _forward(x, bias, _wants_dbias(inputs), activation, scale)


def torch_baseline(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """What a user runs today: torch's autograd through its eager chain (mul, add, F.gelu, ...) in the input
    dtype; the forward graph is built once per inputs, so the baseline times the backward alone."""
    return autograd_baseline(inputs, _torch_forward)


def pointwise_backward_problem(rows: int, cols: int, dtype: str, activation: str, bias: bool) -> Problem:
    """The problem of an input viewed as [rows, cols] (the key the ops build, as a mapping): without a bias, the
    row of rows * cols elements the kernel sees."""
    if bias:
        return {"rows": row_bucket(rows), "cols": cols, "dtype": dtype, "activation": activation, "bias": True}
    return {"rows": 1, "cols": row_bucket(rows * cols), "dtype": dtype, "activation": activation, "bias": False}


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    # As the forward's: input spans the saturating tails of every activation; scale 0.5 catches a kernel that
    # ignores it; a bias off zero catches one that drops it.
    x = (3.0 * randn(rows, cols)).to(dtype)
    dy = randn(rows, cols).to(dtype)
    bias = (0.5 * randn(cols) + 0.25).to(dtype) if problem["bias"] else None
    return (x, dy, bias, bool(problem["bias"]), str(problem["activation"]), 0.5)


SHAPE_USAGE = "a shape N (one flat tensor) or ...xN (a bias over N), e.g. 134217728 or 8192x4096"


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("pointwise_backward", shape, dtype, SHAPE_USAGE)
    return pointwise_backward_problem(math.prod(shape[:-1]), shape[-1], dtype, "gelu_tanh", bias=len(shape) > 1)


def key_of(inputs: Inputs) -> ProblemKey:
    x, bias, activation = inputs[0], inputs[2], inputs[4]
    dtype = DTYPE_NAMES[x.dtype]
    if bias is None:
        return (1, row_bucket(x.numel()), dtype, activation, False)
    n = x.shape[-1]
    return (row_bucket(x.numel() // n if n else 0), n, dtype, activation, True)


INTERPRETER_PROBLEMS = ((64, 96, "gelu", True), (1, 4096, "gelu_tanh", False), (32, 48, "silu", True))
GPU_PROBLEMS = (
    (8192, 4096, "bfloat16", "gelu_tanh", True),
    (4096, 11008, "bfloat16", "silu", True),
    (16384, 1024, "float16", "gelu", True),
    (8192, 4097, "float16", "gelu_tanh", True),  # a row length no vector divides
    (1, 1 << 27, "float32", "gelu_tanh", False),  # the forward's headline stream
    (1, 1 << 26, "bfloat16", "gelu", False),
)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: keep its set small enough to tune in seconds.
    if device.is_interpreter:
        return [pointwise_backward_problem(m, n, "float32", act, bias) for m, n, act, bias in INTERPRETER_PROBLEMS]
    return [pointwise_backward_problem(*p) for p in GPU_PROBLEMS]


# Heuristic: untuned on a GPU for this kernel. With a bias, LayerNorm backward's H200 sweep (8 KiB tiles, 64 bytes
# per thread, 8 warps per SM); rows wider than a tile are cut into the column tile of 512+ elements that pads
# least. Without a bias, the forward's flat choice (kernels/pointwise/pointwise.py: 2048 elements at 4 warps).
MIN_CHUNK = 512


def _column_tile(cols: int, size: int, max_tiles: int) -> int:
    """The whole row when a tile holds it; else the chunk of MIN_CHUNK..MAX_BLOCK_N that pads least (the wider
    on ties), among those giving at most `max_tiles` column tiles (MAX_BLOCK_N if none does)."""
    if single_block_n(cols) <= TILING.tile_bytes // size:
        return single_block_n(cols)
    chunks = [1 << k for k in range(MIN_CHUNK.bit_length() - 1, MAX_BLOCK_N.bit_length())]
    fitting = [b for b in chunks if cdiv(cols, b) <= max_tiles] or [MAX_BLOCK_N]
    return min(fitting, key=lambda b: (cdiv(cols, b) * b, -b))


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), str(problem["dtype"])
    if not problem["bias"]:
        flat = pointwise_heuristic(pointwise_problem(cols, 0, dtype, str(problem["activation"]), False), device)
        block_n = min(int(flat["BLOCK"]), single_block_n(cols))
        return {"BLOCK_N": block_n, "ROWS": 1, "PROGRAMS_PER_SM": 1, "num_warps": flat["num_warps"], "num_stages": 1}
    size = element_bytes(dtype)
    block_n = _column_tile(cols, size, MAX_PROGRAMS_PER_SM * launch_sms(device.sm_count))
    tile_rows = TILING.tile_rows(block_n, size, rows)  # rows: a power of two
    warps = TILING.warps(tile_rows * block_n, size)
    config: Config = {"BLOCK_N": block_n, "ROWS": tile_rows, "PROGRAMS_PER_SM": 1, "num_warps": warps, "num_stages": 1}
    counts = [c for c in (1, 2, 4, 8) if SPACE.is_valid({**config, "PROGRAMS_PER_SM": c}, problem, device)]
    preferred = TILING.programs_per_sm(warps)  # the most resident programs up to 8 warps per SM, else the fewest
    per_sm = max((c for c in counts if c <= preferred), default=min(counts, default=1))
    return {**config, "PROGRAMS_PER_SM": per_sm}


# fp32 operations per element of act'(z) (exp/erf counted as one), for the flops column.
_DERIVATIVE_FLOPS = {"none": 0, "relu": 1, "gelu": 8, "gelu_tanh": 12, "silu": 7, "sigmoid": 6, "tanh": 6}


def bytes_moved(problem: Problem) -> int:
    """grad and input read, d_input written; with a bias, the bias read and d_bias written (no workspace)."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    return (3 * rows * cols + 2 * cols * int(bool(problem["bias"]))) * element_bytes(str(problem["dtype"]))


def flops(problem: Problem) -> int:
    per_element = 3 + _DERIVATIVE_FLOPS[str(problem["activation"])] + 2 * int(bool(problem["bias"]))
    return per_element * int(problem["rows"]) * int(problem["cols"])


def backward_geometry(config: Config, problem: Problem, warp_size: int) -> Geometry:
    """[ROWS, BLOCK_N] tiles. With a bias a persistent grid (the workspace costed for WORKSPACE_SMS, as the norm
    backwards'), each program writing one partial row that a second kernel sums; without, one program per tile."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    block_n, tile_rows, per_sm = int(config["BLOCK_N"]), int(config["ROWS"]), int(config["PROGRAMS_PER_SM"])
    e = element_bytes(str(problem["dtype"]))
    threads = warp_size * int(config["num_warps"])
    bias = bool(problem["bias"])
    col_tiles, row_tiles = cdiv(cols, block_n), cdiv(rows, tile_rows)
    ops = 4 + 2 * ACTIVATION_OPS.get(str(problem["activation"]), 10) + 2 * int(bias)  # act' costs ~2 act
    useful = float(rows) * cols
    tile = tile_rows * block_n
    workspace = float(row_programs(config, rows, cols, WORKSPACE_SMS)) * cols * FP32_BYTES if bias else 0.0
    return Geometry(
        dims=(TileDim("rows", row_tiles, tile_rows), TileDim("cols", col_tiles, block_n)),
        shape=f"{tile_rows}x{block_n}" + (f"@{per_sm}" if bias else ""),
        useful_work=useful,
        padded_work=float(row_tiles * tile_rows) * col_tiles * block_n,
        useful_flops=useful * ops,
        flops_per_tile=float(tile) * ops,
        math="alu",
        tile_bytes=useful / (row_tiles * col_tiles) * e * 3 + (block_n * e if bias else 0),
        dram_bytes=useful * e * 3 + 2 * cols * e * int(bias) + workspace,
        inflight_bytes=2.0 * tile * e,  # grad and input of the prefetched tile
        threads=threads,
        regs_per_thread=estimate_registers(tile / threads, threads, BACKWARD_REGISTERS_PER_ELEMENT),
        smem_bytes=block_n * FP32_BYTES if bias and tile_rows > 1 else 0,  # the final cross-row sum
        persistent=bias,
        max_programs_per_sm=per_sm if bias else None,
        extra_kernels=int(bias),
        extra_dram_bytes=workspace + cols * e * int(bias),
    )


# fp32: act' in fp32 against float64 is a few ulp; d_bias sums `rows` terms in another order than float64 (~1e-6
# relative of Σ|dz|). fp16/bf16: both sides round to the output dtype once, as the forward.
TOLERANCES = rounded_once(Tolerance(atol=1e-4, rtol=1e-4), float16_atol=1e-3, bfloat16_atol=1e-2)

SPEC = op_kernel_spec(
    __name__,
    name="pointwise_backward",
    description="Backward of act(x * scale + bias) + residual in one pass: d_input, d_bias (relu, gelu, silu, ...)",
    space=SPACE,
    problem_fields=("rows", "cols", "dtype", "activation", "bias"),
    problem_values={"activation": tuple(ACTIVATION_OPS)},
    tolerances=TOLERANCES,
    version=1,
    shape_help=(
        "N (one flat tensor, no bias) or ...xN (bias over the last dim N, d_bias wanted), e.g. 134217728 or "
        "8192x4096; activation gelu_tanh"
    ),
    model=KernelModel(backward_geometry, ("rows", "cols"), row_size_classes, ("BLOCK_N", "ROWS", "PROGRAMS_PER_SM")),
)
