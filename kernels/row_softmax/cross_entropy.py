"""Fused cross entropy over 2-D logits [N, V] and int64 targets [N]: the loss (F.cross_entropy's, ignore_index,
reduction mean / sum / none) and, in the same read of the logits, d(loss)/d(logits) for grad_output = 1 in the
logits' dtype (softmax - onehot, times the reduction's scale: 1 / count of non-ignored rows for mean). fp32 math.

Launches, in order: `_ce_count` (mean only: one program counts the non-ignored targets), the rows kernel
(`_ce_single`: ROWS whole rows in registers; `_ce_online`: one row per program, an online max / rescaled sum over
BLOCK_N chunks, then a second pass writing the gradient), `_ce_finish` (mean / sum: one program sums the fp32 row
losses in a fixed order, divides by the count for mean). 'none' writes each row's loss in the logits' dtype.

Ignored rows (target == ignore_index) have loss 0 and gradient 0; their logits are never read. A mean over no
rows is 0/0 = NaN, as torch's. A target outside [0, V) that is not ignore_index reads nothing out of bounds: its
row's loss and gradient are NaN (torch raises a device-side assert instead).
"""

from __future__ import annotations

# isort: off
import tunekit.core.backend  # noqa: F401  (before triton: it selects the interpreter without a GPU)

# isort: on
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
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
    quiet_masked_math,
    row_flops,
    vector_elements,
    warps_for,
)
from tunekit.kernels.row_softmax.softmax import single_rows_config
from tunekit.kernels.rows_perf_model import forward_model
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.row_softmax.cross_entropy import SPACE
from tunekit.search_spaces.rows import MAX_BLOCK_ELEMENTS, MAX_CHUNKS, single_block_n

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

REDUCTIONS = ("mean", "sum", "none")
FINISH_BLOCK = 1024  # targets / row losses per step of the one-program count and finish kernels


@triton.jit
def _ce_count(T, COUNT, N, ignore_index, BLOCK: tl.constexpr):
    """COUNT[0] = the number of targets that are not ignore_index, as fp32."""
    offs = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK):
        t = tl.load(T + start + offs, mask=start + offs < N, other=ignore_index)
        count += (t != ignore_index).to(tl.float32)
    tl.store(COUNT, tl.sum(count, axis=0))


@triton.jit
def _ce_finish(ROW_LOSS, COUNT, LOSS, N, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """LOSS[0] = the sum of the fp32 row losses (divided by COUNT[0] for mean), in LOSS's dtype."""
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK):
        total += tl.load(ROW_LOSS + start + offs, mask=start + offs < N, other=0.0)
    loss = tl.sum(total, axis=0)
    if MEAN:
        loss = loss / tl.load(COUNT)
    tl.store(LOSS, loss.to(LOSS.dtype.element_ty))


@triton.jit
def _ce_scale(COUNT, MEAN: tl.constexpr):
    """The gradient's scale: 1 / count for mean, else 1."""
    if MEAN:
        return 1.0 / tl.load(COUNT)
    return 1.0


@triton.jit
def _ce_single(
    X,  # [N, V] logits, unit stride along V
    T,  # [N] int64 targets
    ROW_LOSS,  # [N] loss per row (fp32 for mean / sum, the logits' dtype for none)
    DX,  # [N, V] gradient, unit stride along V (unused without WRITE_GRAD)
    COUNT,  # [1] fp32 count of non-ignored targets (mean only)
    N, V, stride_x, stride_dx, ignore_index,
    MEAN: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    in_rows = rows < N
    t = tl.load(T + rows, mask=in_rows, other=ignore_index)
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= V))
    rows64 = rows.to(tl.int64)[:, None]
    mask = (in_rows & keep)[:, None] & (cols < V)[None, :]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    row_max = tl.max(x, axis=1)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    e = tl.exp2((x - shift[:, None]) * 1.4426950408889634)
    total = tl.sum(e, axis=1)
    hit = cols[None, :] == t[:, None]
    x_t = tl.sum(tl.where(hit & mask, x, 0.0), axis=1)
    loss = tl.where(keep, shift + tl.log(total) - x_t, 0.0)
    loss = tl.where(bad, float("nan"), loss)
    tl.store(ROW_LOSS + rows, loss.to(ROW_LOSS.dtype.element_ty), mask=in_rows)
    if WRITE_GRAD:
        scale = _ce_scale(COUNT, MEAN)
        g = (e * (1.0 / total)[:, None] - hit.to(tl.float32)) * scale
        g = tl.where(keep[:, None], g, 0.0)
        g = tl.where(bad[:, None], float("nan"), g)
        out_mask = in_rows[:, None] & (cols < V)[None, :]
        tl.store(DX + rows64 * stride_dx + cols[None, :], g.to(DX.dtype.element_ty), mask=out_mask)


@triton.jit
def _ce_online(
    X,  # [N, V] logits, unit stride along V
    T,  # [N] int64 targets
    ROW_LOSS,  # [N] loss per row
    DX,  # [N, V] gradient, unit stride along V
    COUNT,  # [1] fp32 count of non-ignored targets (mean only)
    V, stride_x, stride_dx, ignore_index,
    MEAN: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    t = tl.load(T + row)
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= V))
    cols = tl.arange(0, BLOCK_N)
    # Per lane: the running max and the sum of exp(x - running max), rescaled whenever the max grows.
    lane_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, V, BLOCK_N):
        offs = start + cols
        x = tl.load(x_row + offs, mask=(offs < V) & keep, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        lane_shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp2((lane_max - lane_shift) * 1.4426950408889634) + tl.exp2(
            (x - lane_shift) * 1.4426950408889634
        )
        lane_max = new_max
    row_max = tl.max(lane_max, axis=0)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(lane_sum * tl.exp2((lane_max - shift) * 1.4426950408889634), axis=0)
    lse = shift + tl.log(total)
    x_t = tl.load(x_row + t, mask=keep & ~bad, other=0.0).to(tl.float32)
    loss = tl.where(keep, lse - x_t, 0.0)
    loss = tl.where(bad, float("nan"), loss)
    tl.store(ROW_LOSS + row, loss.to(ROW_LOSS.dtype.element_ty))
    if WRITE_GRAD:
        scale = tl.where(bad, float("nan"), _ce_scale(COUNT, MEAN))
        dx_row = DX + row * stride_dx
        n_chunks = tl.cdiv(V, BLOCK_N)
        for k in tl.range(0, n_chunks):  # last chunk first: the likeliest still cached
            offs = (n_chunks - 1 - k) * BLOCK_N + cols
            mask = offs < V
            x = tl.load(x_row + offs, mask=mask & keep, other=float("-inf")).to(tl.float32)
            p = tl.exp2((x - lse) * 1.4426950408889634)
            g = tl.where(keep, (p - (offs == t).to(tl.float32)) * scale, 0.0)
            tl.store(dx_row + offs, g.to(DX.dtype.element_ty), mask=mask)


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """inputs = (logits [N, V] unit stride along V, target [N] int64 contiguous, ignore_index, reduction);
    outputs = (loss,) or (loss, grad): loss [] (mean, sum) or [N] (none) and grad [N, V] unit stride along V, in
    the logits' dtype. No validation: this is the hot path."""
    x, target, ignore_index, reduction = inputs
    loss = outputs[0]
    grad = outputs[1] if len(outputs) > 1 else x
    n, v = x.shape
    mean, reduced = reduction == "mean", reduction != "none"
    count = torch.empty(1, device=x.device, dtype=torch.float32) if mean else loss
    row_loss = torch.empty(n, device=x.device, dtype=torch.float32) if reduced else loss
    with quiet_masked_math():  # ignored rows: log(0) and 0 * inf, computed then discarded (the interpreter warns)
        if mean:
            _ce_count[(1,)](target, count, n, ignore_index, BLOCK=FINISH_BLOCK)
        if n > 0:
            _launch_rows(config, (x, target, row_loss, grad, count), n, v, ignore_index, mean, len(outputs) > 1)
        if reduced:
            _ce_finish[(1,)](row_loss, count, loss, n, MEAN=mean, BLOCK=FINISH_BLOCK)


def _launch_rows(
    config: Config, tensors: Inputs, n: int, v: int, ignore_index: int, mean: bool, write_grad: bool
) -> None:
    x, _, _, grad, _ = tensors
    options = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    flags = {"MEAN": mean, "WRITE_GRAD": write_grad}
    if config["variant"] == "single":
        rows = int(config["ROWS"])
        _ce_single[(triton.cdiv(n, rows),)](
            *tensors, n, v, x.stride(0), grad.stride(0), ignore_index,
            BLOCK_N=single_block_n(v), ROWS=rows, **flags, **options,
        )  # fmt: skip
    else:
        _ce_online[(n,)](
            *tensors, v, x.stride(0), grad.stride(0), ignore_index,
            BLOCK_N=int(config["BLOCK_N"]), **flags, **options,
        )  # fmt: skip


def alloc_outputs(inputs: Inputs) -> Outputs:
    x, _, _, reduction = inputs
    loss = x.new_empty((x.shape[0],) if reduction == "none" else ())
    return (loss, torch.empty_like(x))


def loss_and_grad(x: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> Outputs:
    """(loss, d(loss)/d(x)) by torch ops in x's dtype (callers pass float32 or float64): softmax - onehot, zero on
    ignored rows, times 1 / count for mean. The reference (in float64) and the op's torch path under compile."""
    keep = target != ignore_index
    safe = torch.where(keep, target, 0)
    logp = torch.log_softmax(x, dim=-1)
    rows = -logp.gather(1, safe[:, None])[:, 0] * keep
    grad = torch.softmax(x, dim=-1)
    grad.scatter_add_(1, safe[:, None], -torch.ones_like(rows)[:, None])
    grad = grad * keep[:, None]
    if reduction == "none":
        return rows, grad
    if reduction == "sum":
        return rows.sum(), grad
    count = keep.sum()
    return rows.sum() / count, grad / count


def reference(inputs: Inputs) -> Outputs:
    x, target, ignore_index, reduction = inputs
    loss, grad = loss_and_grad(x.double(), target, ignore_index, reduction)
    return (loss.to(x.dtype), grad.to(x.dtype))


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs without tunekit: F.cross_entropy on the logits (in their dtype), then backward."""
    x, target, ignore_index, reduction = inputs
    leaf = x.detach().requires_grad_()
    with torch.enable_grad():
        loss = F.cross_entropy(leaf, target, ignore_index=ignore_index, reduction=reduction)
        (grad,) = torch.autograd.grad(loss, leaf, torch.ones_like(loss))
    return (loss.detach(), grad)


IGNORED_FRACTION = 0.125  # of make_inputs' targets: the rows a causal LM's shifted labels mask (padding, prompt)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    # A spread of 3 makes the row max matter; an offset catches a lost max shift.
    x = randn(rows, cols) * 3.0 + 2.0
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    target = torch.randint(0, cols, (rows,), generator=gen, device=device)
    ignored = torch.rand(rows, generator=gen, device=device) < IGNORED_FRACTION
    target = torch.where(ignored, torch.full_like(target, -100), target)
    return (x.to(dtype), target, -100, str(problem["reduction"]))


def problem(shape: tuple[int, int], dtype: str, reduction: str = "mean") -> Problem:
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "reduction": reduction}


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("cross_entropy", shape, dtype, "a 2-D shape NxV (N rows of V logits, e.g. 4096x32000)", (2,))
    m, n = shape
    return problem((m, n), dtype)


def key_of(inputs: Inputs) -> ProblemKey:
    x, _, _, reduction = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], reduction)


_INTERPRETER_PROBLEMS = (((16, 1000), "float32", "mean"), ((8, 3000), "bfloat16", "sum"), ((32, 33), "float16", "none"))
_GPU_PROBLEMS = (
    ((4096, 32000), "bfloat16", "mean"),
    ((4096, 32000), "float32", "mean"),
    ((8192, 32000), "bfloat16", "sum"),
    ((4096, 128256), "bfloat16", "mean"),
    ((8192, 151936), "bfloat16", "mean"),
    ((2048, 50257), "float16", "mean"),
    ((16384, 4096), "bfloat16", "none"),
)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    chosen = _INTERPRETER_PROBLEMS if device.is_interpreter else _GPU_PROBLEMS
    return [problem(*p) for p in chosen]


SINGLE_MAX_BLOCK_N = 4096  # whole rows in registers up to here; longer rows loop (one row per program)
ONLINE_WARPS = 8
VECTORS_PER_THREAD = 2  # 16-byte vectors each thread loads per chunk


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    width = single_block_n(cols)
    if width <= SINGLE_MAX_BLOCK_N:
        return single_rows_config(rows, width, device)
    # Bandwidth bound: 16-byte vectors, VECTORS_PER_THREAD of them per thread per chunk (2 * 8 * 256 = 4096 bf16
    # logits), at most MAX_CHUNKS chunks unless the chunk is the space's widest.
    chunk = ONLINE_WARPS * 32 * vector_elements(str(problem["dtype"])) * VECTORS_PER_THREAD
    block_n = min(MAX_BLOCK_ELEMENTS, max(chunk, next_pow2(cols) // MAX_CHUNKS))
    warps = max(ONLINE_WARPS, warps_for(block_n, 32, 32))
    return {"variant": "online", "BLOCK_N": block_n, "ROWS": 1, "num_warps": warps, "num_stages": 1}


def bytes_moved(problem: Problem) -> int:
    """Logits read once, the gradient written once (the second read of a row is an L2 hit)."""
    return 2 * int(problem["rows"]) * int(problem["cols"]) * element_bytes(str(problem["dtype"]))


flops = row_flops(8)


SPEC = op_kernel_spec(
    __name__,
    name="cross_entropy",
    description="cross entropy loss and its gradient in one forward over 2-D logits (fp32 math; single, online)",
    space=SPACE,
    problem_fields=("rows", "cols", "dtype", "reduction"),
    problem_values={"reduction": REDUCTIONS},
    # Losses are O(1..20), gradients O(1) (sum, none) or O(1 / rows) (mean): fp32 differs from the fp64
    # reference by exp2/log approximations and summation order (~1e-6 relative); fp16/bf16 round the result once.
    # The half atols admit torch's baseline, whose backward rounds log-probabilities of ~-10 to fp16/bf16 first
    # (bf16: 2**-4 there, a few percent of a small probability: 1e-3 absolute seen at V = 3000).
    tolerances=rounded_once(Tolerance(atol=1e-6, rtol=1e-4), float16_atol=2e-4, bfloat16_atol=2e-3),
    version=1,
    shape_help="NxV (N rows of V logits, loss mean over the rows), e.g. 4096x32000",
    # ~10 fp32 operations per element over both passes; online reads the logits twice; no parameter vectors.
    model=forward_model(ops=10, looped_reads={"online": 2}, params=lambda problem: 0),
)
