"""Sum, mean and max (with first-occurrence indices) over one axis, fp32 accumulation.

Two kernel families (see search_spaces/reduction/reduction.py for the space):
- `_reduce_inner`: reduce the last, contiguous dim of a 2-D [M, N] tensor. A program owns BLOCK_M rows and walks
  them in [BLOCK_M, BLOCK_N] chunks, accumulating lane-wise; the cross-lane reduction happens once at the end.
- `_reduce_outer`: reduce the middle dim of a [B, M, N] tensor (dim 0 of a 2-D tensor when B == 1). A program
  owns BLOCK_N contiguous columns of one batch and walks its rows in [BLOCK_M, BLOCK_N] chunks, so every load is a
  contiguous run along N. With SPLIT > 1 (variant `outer_split`) the rows are cut into SPLIT contiguous runs that
  reduce into an fp32 workspace [B, SPLIT, N]; a second launch of the same kernel combines the partials in
  order. No atomics: results are bitwise deterministic for a given config.

The output dtype is the output tensor's (the op passes torch's result dtype). Max follows torch.max: NaN wins over
every number and the index is the first NaN's; otherwise the first index of the maximum. Indices are int32 inside
the kernels (the reduced dim must be < 2**31 - 1) and are converted to the index tensor's dtype on store.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# isort: off
import tunekit.core.backend  # noqa: F401  (before triton: it selects the interpreter without a GPU)

# isort: on
from typing import TYPE_CHECKING

import torch
import triton

from tunekit.core.errors import InvalidConfigError
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import cdiv, check_shape, element_bytes, next_pow2, op_kernel_spec, prev_pow2, warps_for
from tunekit.kernels.reduction.perf_model import MODEL
from tunekit.kernels.reduction.reduction_jit import _reduce_inner, _reduce_outer
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.reduction.reduction import MAX_BLOCK_N, MAX_INNER_CHUNKS, MAX_SPLIT, MIN_OUTER_BLOCK_N, SPACE

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

OPS = ("sum", "mean", "max")
AXES = ("inner", "outer")
OP_CODES = {"sum": 0, "mean": 1, "max": 2}
# The tuner poisons every output with NaN, which an integer tensor cannot hold: the spec's max indices are float64
# (exact below 2**53; the kernel converts on store). The ops allocate int64 indices like torch.
SPEC_INDEX_DTYPE = torch.float64


def _launch_outer(
    x: torch.Tensor,
    idx_in: torch.Tensor | None,
    y: torch.Tensor,
    idx: torch.Tensor | None,
    op_code: int,
    scale: float,
    split: int,
    block_m: int,
    block_n: int,
    options: dict[str, int],
) -> None:
    b, m, n = x.shape
    per_split = cdiv(cdiv(m, split), block_m) * block_m
    grid = (b * cdiv(n, block_n), split)
    _reduce_outer[grid](
        x, x if idx_in is None else idx_in, y, y if idx is None else idx,
        m, n, x.stride(0), x.stride(1), per_split, scale,
        OP=op_code, HAS_IDX_IN=idx_in is not None, BLOCK_M=block_m, BLOCK_N=block_n, **options,
    )  # fmt: skip


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Reduce x over `axis`; outputs are (values,) or (values, indices) for max. No validation: the hot path.

    inputs = (x, op, axis): x is [M, N] (axis "inner", reduce N) or [B, M, N] (axis "outer", reduce M), unit
    stride along N. Outputs are contiguous: [M] for inner, [B, N] for outer.
    """
    x, op, axis = inputs
    y = outputs[0]
    idx = outputs[1] if op == "max" else None
    variant = config["variant"]
    if (variant == "inner") != (axis == "inner"):
        raise InvalidConfigError(f"reduction variant {variant!r} cannot reduce axis {axis!r}")
    op_code = OP_CODES[op]
    options = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    if axis == "inner":
        m, n = x.shape
        if m == 0:
            return
        _reduce_inner[(triton.cdiv(m, block_m),)](
            x, y, y if idx is None else idx, m, n, x.stride(0), 1.0 / max(n, 1),
            OP=op_code, BLOCK_M=block_m, BLOCK_N=block_n, **options,
        )  # fmt: skip
        return
    b, m, n = x.shape
    if b == 0 or n == 0:
        return
    split = int(config["SPLIT"])
    if split == 1:
        _launch_outer(x, None, y, idx, op_code, 1.0 / max(m, 1), 1, block_m, block_n, options)
        return
    # Pass 1: SPLIT partial results per column, in fp32 (max values convert exactly), in row order.
    partial = torch.empty((b, split, n), device=x.device, dtype=torch.float32)
    partial_idx = torch.empty((b, split, n), device=x.device, dtype=torch.int32) if idx is not None else None
    _launch_outer(x, None, partial, partial_idx, 0 if op == "mean" else op_code, 1.0, split, block_m, block_n, options)
    # Pass 2: combine them in order (deterministic). A small [B, SPLIT, N] problem: one chunk down the splits.
    combine_n = min(block_n, 256)
    combine_m = max(1, min(split, 4096 // combine_n))
    _launch_outer(
        partial, partial_idx, y, idx, op_code, 1.0 / m, 1, combine_m, combine_n, {"num_warps": 4, "num_stages": 1}
    )


def _outputs(inputs: Inputs, index_dtype: torch.dtype) -> Outputs:
    x, op, axis = inputs
    shape = (x.shape[0],) if axis == "inner" else (x.shape[0], x.shape[2])
    values = torch.empty(shape, device=x.device, dtype=x.dtype)
    if op != "max":
        return (values,)
    return (values, torch.empty(shape, device=x.device, dtype=index_dtype))


def alloc_outputs(inputs: Inputs) -> Outputs:
    return _outputs(inputs, SPEC_INDEX_DTYPE)


def torch_reduction(inputs: Inputs, outputs: Outputs) -> None:
    """torch's own reduction into the outputs the kernel would have written: what tunekit.ops runs where dispatch
    serves torch. Dim 1 is the reduced one of [M, N] (inner) and of [B, M, N] (outer); max's indices are int64."""
    x, op, _ = inputs
    if op == "max":
        torch.max(x, 1, out=(outputs[0], outputs[1]))
    else:
        (torch.sum if op == "sum" else torch.mean)(x, 1, out=outputs[0])


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs without tunekit: torch.sum / mean / max in the input dtype, int64 indices (as the ops
    allocate them; the integer check compares them exactly with the reference's)."""
    outputs = _outputs(inputs, torch.int64)
    torch_reduction(inputs, outputs)
    return outputs


def reference(inputs: Inputs) -> Outputs:
    x, op, _ = inputs
    xd = x.double()  # dim 1 is the reduced one of [M, N] (inner) and of [B, M, N] (outer)
    if op == "max":
        values, idx = torch.max(xd, dim=1)
        return (values.to(x.dtype), idx.to(SPEC_INDEX_DTYPE))
    out = xd.sum(1) if op == "sum" else xd.mean(1)
    return (out.to(x.dtype),)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    op, axis, dtype = str(problem["op"]), str(problem["axis"]), DTYPES[str(problem["dtype"])]
    rows, cols = int(problem["rows"]), int(problem["cols"])
    shape = (rows, cols) if axis == "inner" else (int(problem["batch"]), rows, cols)
    gen = torch.Generator(device=device).manual_seed(seed)
    # An offset mean keeps sums away from zero (relative tolerances stay meaningful) and catches lost chunks.
    x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).clamp_(-4.0, 4.0) + 0.5
    if op == "max":
        # A unique maximum per reduced line (no ties), planted at a random position of the reduced dim.
        line_max = x.amax(dim=1, keepdim=True)  # dim 1 is the reduced one of [M, N] and of [B, M, N]
        where = torch.randint(0, x.shape[1], line_max.shape, generator=gen, device=device)
        x.scatter_(1, where, line_max + 1.0)
    return (x.to(dtype), op, axis)


def problem(op: str, axis: str, shape: tuple[int, ...], dtype: str) -> Problem:
    """The problem of reducing x of `shape` ([M, N] for inner, [B, M, N] for outer) with `op` along `axis`."""
    if axis == "inner":
        (m, n), b = shape, 1
    else:
        b, m, n = shape
    return {"op": op, "axis": axis, "batch": row_bucket(b), "rows": row_bucket(m), "cols": n, "dtype": dtype}


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    usage = "MxN (sum over the last dim) or BxMxN (sum over the middle dim M; B=1 for dim 0 of a 2-D tensor)"
    check_shape("reduction", shape, dtype, usage, (2, 3))
    return problem("sum", "inner" if len(shape) == 2 else "outer", shape, dtype)


def key_of(inputs: Inputs) -> ProblemKey:
    """x is [M, N] (inner: reduce N) or [B, M, N] (outer: reduce M)."""
    x, op, axis = inputs
    dtype = DTYPE_NAMES[x.dtype]
    if axis == "inner":
        return (op, axis, 1, row_bucket(x.shape[0]), x.shape[1], dtype)
    return (op, axis, row_bucket(x.shape[0]), row_bucket(x.shape[1]), x.shape[2], dtype)


_INTERPRETER_PROBLEMS = (
    ("sum", "inner", (64, 1000), "float32"),
    ("max", "inner", (16, 300), "float32"),
    ("sum", "outer", (1, 256, 48), "float32"),
    ("mean", "outer", (4, 64, 20), "float16"),
)
_GPU_PROBLEMS = (
    ("sum", "inner", (16384, 4096), "float16"),
    ("sum", "inner", (4096, 4097), "float32"),
    ("mean", "inner", (65536, 768), "bfloat16"),
    ("max", "inner", (8192, 8192), "bfloat16"),
    ("sum", "outer", (1, 4096, 16384), "float32"),
    ("sum", "outer", (1, 1048576, 16), "float32"),
    ("sum", "outer", (1, 16777216, 1), "float32"),
    ("mean", "outer", (64, 512, 768), "bfloat16"),
    ("max", "outer", (1, 8192, 1024), "float16"),
)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: keep its set small enough to tune in well under a minute.
    chosen = _INTERPRETER_PROBLEMS if device.is_interpreter else _GPU_PROBLEMS
    return [problem(*p) for p in chosen]


INNER_TILE = 1024  # elements per chunk of an inner program: measured best on an H200 for wide and narrow rows
OUTER_TILE = 4096  # elements per chunk of an outer program
INNER_MIN_EXACT_CHUNK = 128


def _heuristic_inner(op: str, rows: int, cols: int, device: DeviceFingerprint) -> Config:
    # Small programs (1Ki-element chunks, 4 warps; 2 for max, whose update is heavier) in a pipelined loop beat
    # one wide block per row on an H200: more programs per SM keep more loads in flight.
    block_n = min(next_pow2(cols), INNER_TILE)
    divisor = cols & -cols  # the largest power of two dividing cols: chunks of it leave no lane masked off
    if INNER_MIN_EXACT_CHUNK <= divisor < block_n:
        block_n = divisor  # e.g. 768 columns: three 256-wide chunks, not one 1024-wide with a quarter idle
    if cdiv(cols, block_n) > MAX_INNER_CHUNKS:
        block_n = min(MAX_BLOCK_N, next_pow2(cdiv(cols, MAX_INNER_CHUNKS)))
    block_m = max(1, INNER_TILE // block_n)
    if device.sm_count > 0:  # keep at least two programs per SM
        block_m = min(block_m, prev_pow2(rows // (2 * device.sm_count)))
    block_m = min(block_m, rows)
    tile = block_m * block_n
    return {
        "variant": "inner",
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "SPLIT": 1,
        "num_warps": warps_for(tile, 16 if op == "max" else 8, 8),
        "num_stages": 2 if block_n < cols else 1,
    }


def _heuristic_outer(batch: int, rows: int, cols: int, dtype: str, device: DeviceFingerprint) -> Config:
    width = next_pow2(cols)
    # 256 bytes of each row per chunk: whole 128-byte lines, several 16-byte vectors per warp.
    block_n = min(width, 256 // element_bytes(dtype))
    if device.sm_count > 0:  # narrower column blocks (down to whole sectors) before splitting the rows
        while block_n > min(width, MIN_OUTER_BLOCK_N) and batch * cdiv(cols, block_n) < 2 * device.sm_count:
            block_n //= 2
    block_m = min(next_pow2(rows), max(1, OUTER_TILE // block_n))
    split = 1
    programs = batch * cdiv(cols, block_n)
    if device.sm_count > 0 and programs < device.sm_count:
        split = prev_pow2(min(MAX_SPLIT, (4 * device.sm_count) // programs, rows // block_m))
    return {
        "variant": "outer_split" if split > 1 else "outer",
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "SPLIT": split if split > 1 else 1,
        "num_warps": warps_for(block_m * block_n, 8, 8),  # at most 64 per thread up to the 16Ki tile
        "num_stages": 1 if block_m >= cdiv(rows, split) else 2,
    }


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    if problem["axis"] == "inner":
        config = _heuristic_inner(str(problem["op"]), rows, cols, device)
    else:
        config = _heuristic_outer(int(problem["batch"]), rows, cols, str(problem["dtype"]), device)
    if not SPACE.is_valid(config, problem, device):  # e.g. two stages that do not fit shared memory
        config["num_stages"] = 1
    return config


def bytes_moved(problem: Problem) -> int:
    batch, rows, cols = int(problem["batch"]), int(problem["rows"]), int(problem["cols"])
    size = element_bytes(str(problem["dtype"]))
    kept = batch * (rows if problem["axis"] == "inner" else cols)
    out = kept * (size + (8 if problem["op"] == "max" else 0))
    return batch * rows * cols * size + out


def flops(problem: Problem) -> int:
    return int(problem["batch"]) * int(problem["rows"]) * int(problem["cols"])


SPEC = op_kernel_spec(
    __name__,
    name="reduction",
    description="sum / mean / max (+ indices) over the last dim or a leading/middle dim, fp32 accumulation",
    space=SPACE,
    problem_fields=("op", "axis", "batch", "rows", "cols", "dtype"),
    problem_values={"op": OPS, "axis": AXES},
    # Max values are exact. Sums and means differ from the fp64 reference by fp32 accumulation (~1e-7 relative
    # per element, a few 1e-6 over 16Ki terms) and, for fp16/bf16, by one rounding of the result. Inputs have
    # mean 0.5, so sums are far from cancelling to zero. Max indices (float64 in the spec) are compared with the
    # float32 entry: exact below 10**5 (atol + rtol*index<1).
    tolerances=rounded_once(Tolerance(atol=1e-4, rtol=1e-5), float16_atol=1e-3, bfloat16_atol=8e-3),
    version=1,
    shape_help="MxN: sum over the last dim; BxMxN: sum over the middle dim M (B=1: dim 0 of a 2-D tensor)",
    model=MODEL,
)
