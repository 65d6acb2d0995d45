"""Rotary position embedding of q and k in one pass, as transformers' `apply_rotary_pos_emb` computes it:

    y = x * cos + rotate_half(x) * sin,    rotate_half(x) = cat(-x2, x1)    (x1, x2 the halves of the head dim D)

so y1 = x1 * c1 - x2 * s1 and y2 = x2 * c2 + x1 * s2 (c1, c2, s1, s2 the halves of cos and sin; nothing assumes
they are equal). Math in fp32, one rounding to the output dtype. The backward (kernels/rope/rope_backward.py) runs the
same jit kernel with BACKWARD set: the adjoint dx = g * cos + R^T(g * sin), R^T(v) = cat(v2, -v1), is the
forward's formula with the sin halves (s1, s2) replaced by (-s2, -s1).

One launch rotates q and k: program (i, j) takes rows [i * BLOCK_R, ...) of the B * S rows and heads
[j * BLOCK_H, ...) of both (masked to each one's head count, so grouped-query k with fewer heads is fine), loading
cos and sin once for all of them.

Inputs tuple: (q, k, cos, sin) with q [B, S, Hq, D] and k [B, S, Hk, D] (any strides but a unit last one: the op
passes transposed views as they are), cos and sin [Bc, S, D] with Bc 1 (broadcast over the batch) or B, unit
last stride, of q's dtype. Outputs: (q_out, k_out) of q's and k's shapes and dtype, any strides with a unit last
one (alloc_outputs keeps the inputs' layout, as torch's elementwise ops do).

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

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
    warps_for,
)
from tunekit.kernels.rope.perf_model import MODEL
from tunekit.kernels.tolerances import rounded_once
from tunekit.search_spaces.rope.rope import SPACE, half_block, max_heads

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint


@triton.jit
def _rotate_heads(
    X, Y, b, s, h, d, row_ok, heads,
    x_sb, x_ss, x_sh, y_sb, y_ss, y_sh,
    c1, c2, s1, s2,
    HALF: tl.constexpr,
):  # fmt: skip
    """One tensor's [BLOCK_R, BLOCK_H, D] tile: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2."""
    mask = (row_ok[:, None] & (h < heads)[None, :])[:, :, None] & (d < HALF)[None, None, :]
    x_offs = (b * x_sb + s * x_ss)[:, None, None] + (h * x_sh)[None, :, None] + d[None, None, :]
    x1 = tl.load(X + x_offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + x_offs + HALF, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c1[:, None, :] - x2 * s1[:, None, :]
    y2 = x2 * c2[:, None, :] + x1 * s2[:, None, :]
    y_offs = (b * y_sb + s * y_ss)[:, None, None] + (h * y_sh)[None, :, None] + d[None, None, :]
    tl.store(Y + y_offs, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + y_offs + HALF, y2.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, COS, SIN, QO, KO,
    rows, seq_len, q_heads, k_heads,
    q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, c_sb, c_ss,
    qo_sb, qo_ss, qo_sh, ko_sb, ko_ss, ko_sh,
    HALF: tl.constexpr, BACKWARD: tl.constexpr, INT64: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    if INT64:
        r = r.to(tl.int64)
        h = h.to(tl.int64)
    row_ok = r < rows
    b = r // seq_len
    s = r - b * seq_len
    d = tl.arange(0, BLOCK_D)
    cs_mask = row_ok[:, None] & (d < HALF)[None, :]
    cs_offs = (b * c_sb + s * c_ss)[:, None] + d[None, :]
    c1 = tl.load(COS + cs_offs, mask=cs_mask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + cs_offs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + cs_offs, mask=cs_mask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + cs_offs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
    if BACKWARD:  # the adjoint: the forward with sin's halves (-s2, -s1)
        first = s1
        s1 = -s2
        s2 = -first
    _rotate_heads(Q, QO, b, s, h, d, row_ok, q_heads, q_sb, q_ss, q_sh, qo_sb, qo_ss, qo_sh, c1, c2, s1, s2, HALF)
    _rotate_heads(K, KO, b, s, h, d, row_ok, k_heads, k_sb, k_ss, k_sh, ko_sb, ko_ss, ko_sh, c1, c2, s1, s2, HALF)


def _largest_offset(t: torch.Tensor, b_max: int, s_max: int, h_max: int, d_max: int) -> int:
    """The largest element offset a lane forms into t ([B, S, H, D] or [Bc, S, D]), masked lanes included."""
    if t.dim() == 3:
        return b_max * t.stride(0) * int(t.shape[0] > 1) + s_max * t.stride(1) + d_max
    return b_max * t.stride(0) + s_max * t.stride(1) + h_max * t.stride(2) + d_max


def batch_stride(t: torch.Tensor) -> int:
    """cos/sin's batch stride: 0 where one batch row is broadcast over all."""
    return t.stride(0) if t.shape[0] > 1 else 0


def launch_rope(config: Config, inputs: Inputs, outputs: Outputs, backward: bool) -> None:
    """The forward (or, with `backward`, its adjoint on the gradients). No validation: the op validates."""
    q, k, cos, sin = inputs
    qo, ko = outputs
    batch, seq, q_heads, dim = q.shape
    k_heads = k.shape[2]
    rows = batch * seq
    if rows == 0 or dim == 0:
        return
    block_r, block_h, block_d = int(config["BLOCK_R"]), int(config["BLOCK_H"]), next_pow2(dim // 2)
    grid = (cdiv(rows, block_r), cdiv(max(q_heads, k_heads), block_h))
    b_max, h_max, d_max = (grid[0] * block_r - 1) // seq, grid[1] * block_h - 1, block_d - 1 + dim // 2
    largest = max(_largest_offset(t, b_max, seq - 1, h_max, d_max) for t in (q, k, cos, qo, ko))
    _rope_kernel[grid](
        q, k, cos, sin, qo, ko,
        rows, seq, q_heads, k_heads,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        batch_stride(cos), cos.stride(1),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        HALF=dim // 2, BACKWARD=backward, INT64=largest > INT32_LIMIT,
        BLOCK_R=block_r, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )  # fmt: skip


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    launch_rope(config, inputs, outputs, backward=False)


def alloc_outputs(inputs: Inputs) -> Outputs:
    """New tensors in q's and k's layout (empty_like keeps a dense input's strides, as torch's elementwise ops do)."""
    return (torch.empty_like(inputs[0]), torch.empty_like(inputs[1]))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: cat(-x2, x1) over the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb, op for op: what a user runs without tunekit."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def reference(inputs: Inputs) -> Outputs:
    """The formula in float64, rounded once to q's dtype."""
    q, k, cos, sin = inputs
    yq, yk = apply_rotary(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim=2)
    return (yq.to(q.dtype), yk.to(k.dtype))


def torch_baseline(inputs: Inputs) -> Outputs:
    """transformers' formula in the input dtype, on the kernel's [B, S, H, D] views (unsqueeze_dim=2)."""
    q, k, cos, sin = inputs
    return apply_rotary(q, k, cos, sin, unsqueeze_dim=2)


def rope_problem(rows: int, q_heads: int, k_heads: int, head_dim: int, dtype: str, heads_inner: bool = True) -> Problem:
    """The problem of B * S = rows (the key the ops build, as a mapping)."""
    return {
        "rows": row_bucket(rows),
        "q_heads": q_heads,
        "k_heads": k_heads,
        "head_dim": head_dim,
        "dtype": dtype,
        "heads_inner": heads_inner,
    }


def make_rope_inputs(problem: Problem, device: torch.device, seed: int, scale: float = 1.0) -> Inputs:
    """Random [B, S, H, D] views (B = 2 when rows allow, so batch indexing is exercised) in the problem's layout,
    and independent random cos and sin of [B, S, D] whose halves differ (the kernel may not assume they match)."""
    rows, dim, dtype = int(problem["rows"]), int(problem["head_dim"]), DTYPES[str(problem["dtype"])]
    batch = 2 if rows % 2 == 0 else 1
    seq = rows // batch
    randn = normal_sampler(device, seed)

    def heads(count: int) -> torch.Tensor:
        if problem["heads_inner"]:
            return (scale * randn(batch, seq, count, dim)).to(dtype)
        return (scale * randn(batch, count, seq, dim)).to(dtype).transpose(1, 2)  # a [B, H, S, D] buffer

    q, k = heads(int(problem["q_heads"])), heads(int(problem["k_heads"]))
    cos = randn(batch, seq, dim).clamp(-1.0, 1.0).to(dtype)
    sin = randn(batch, seq, dim).clamp(-1.0, 1.0).to(dtype)
    return (q, k, cos, sin)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    return make_rope_inputs(problem, device, seed)


SHAPE_USAGE = "a shape ROWSxHQxHKxD (rows = batch * sequence, q and k heads, head dim), e.g. 4096x32x8x128"


def parse_shape(kernel: str, shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape(kernel, shape, dtype, SHAPE_USAGE, ranks=(4,))
    rows, q_heads, k_heads, dim = shape
    return rope_problem(rows, q_heads, k_heads, dim, dtype)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    return parse_shape("rope", shape, dtype)


def heads_inner(q: torch.Tensor) -> bool:
    """q ([B, S, H, D] view) is a [B, S, H, D] buffer: its head stride is at most its sequence stride."""
    return bool(q.stride(2) <= q.stride(1))


def key_of(inputs: Inputs) -> ProblemKey:
    q, k = inputs[0], inputs[1]
    batch, seq, q_heads, dim = q.shape
    return (row_bucket(batch * seq), q_heads, k.shape[2], dim, DTYPE_NAMES[q.dtype], heads_inner(q))


# (rows, q heads, k heads, head dim, dtype, heads_inner): Llama-like prefill, GQA, decode, a training batch.
GPU_PROBLEMS = (
    (4096, 32, 32, 128, "bfloat16", True),
    (4096, 32, 8, 128, "bfloat16", True),
    (8, 32, 32, 128, "bfloat16", True),
    (8192, 32, 8, 128, "float16", False),
    (16384, 16, 16, 64, "bfloat16", True),
)
INTERPRETER_PROBLEMS = ((16, 4, 2, 32, "float32", True), (8, 3, 1, 24, "float32", False))


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: keep its set small enough to tune in seconds.
    return [rope_problem(*p) for p in (INTERPRETER_PROBLEMS if device.is_interpreter else GPU_PROBLEMS)]


# Heuristic (bandwidth bound, like the pointwise stream, kernels/pointwise/pointwise.py: ~2048-4096 elements per program
# at a warp per 512 is near copy speed on the H200): a q tile of about TARGET_ELEMENTS, heads first (cos/sin
# reuse across heads), then rows; split while the grid gives fewer than MIN_PROGRAMS_PER_SM programs per SM and
# the tile stays at least MIN_ELEMENTS. A whole head dim per program: its 16-byte vectors are full when D/2 is.
TARGET_ELEMENTS = 4096
MIN_ELEMENTS = 1024
MIN_PROGRAMS_PER_SM = 2


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, heads, width = int(problem["rows"]), max_heads(problem), 2 * half_block(problem)
    block_h = min(next_pow2(heads), max(1, TARGET_ELEMENTS // width))
    block_r = min(next_pow2(rows), max(1, TARGET_ELEMENTS // (width * block_h)))
    wanted = MIN_PROGRAMS_PER_SM * max(1, device.sm_count)
    while cdiv(rows, block_r) * cdiv(heads, block_h) < wanted and block_r * block_h * width > MIN_ELEMENTS:
        if block_r > 1:
            block_r //= 2
        elif block_h > 1:
            block_h //= 2
        else:
            break
    warps = warps_for(block_r * block_h * width, 16, 8)
    return {"BLOCK_R": block_r, "BLOCK_H": block_h, "num_warps": warps, "num_stages": 1}


def bytes_moved(problem: Problem) -> int:
    """q and k read and written, cos and sin read once per row (the kernel reuses them over the heads)."""
    rows, dim = int(problem["rows"]), int(problem["head_dim"])
    heads = int(problem["q_heads"]) + int(problem["k_heads"])
    return (2 * heads + 2) * rows * dim * element_bytes(str(problem["dtype"]))


def flops(problem: Problem) -> int:
    """Two multiplies and an add per output element."""
    return 3 * int(problem["rows"]) * (int(problem["q_heads"]) + int(problem["k_heads"])) * int(problem["head_dim"])


# fp32: one fp32 rounding per product and sum against float64 (terms up to ~4: a few 1e-7). fp16/bf16: the
# kernel rounds once, as the reference; torch's formula (the baseline, checked against the same tolerances)
# rounds each product and the sum, and a sum of two terms up to ~3 that cancels keeps their rounding errors:
# atol of about two ulps at 2..4.
TOLERANCES: dict[str, Tolerance] = rounded_once(Tolerance(atol=1e-5, rtol=1e-5), float16_atol=3e-3, bfloat16_atol=2e-2)

SPEC = op_kernel_spec(
    __name__,
    name="rope",
    description="Rotary position embedding of q and k in one pass (transformers' apply_rotary_pos_emb)",
    space=SPACE,
    problem_fields=("rows", "q_heads", "k_heads", "head_dim", "dtype", "heads_inner"),
    tolerances=TOLERANCES,
    version=1,
    model=MODEL,
    shape_help=SHAPE_USAGE,
)
