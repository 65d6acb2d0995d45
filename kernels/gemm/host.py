"""GEMM host launch: operand layouts and alignment, the staged variant's aligned copies, tensor descriptors, the
grid of each variant. No validation here: this is the hot path (tunekit/ops/gemm.py validates).
"""

from __future__ import annotations

import torch
import triton

from tunekit.core import backend
from tunekit.core.device import fingerprint
from tunekit.core.space import Config
from tunekit.core.spec import Inputs, Outputs
from tunekit.kernels.common import INT32_LIMIT, VECTOR_BYTES, pow2_divisor
from tunekit.kernels.gemm.grouped import _gemm_grouped_kernel, _gemm_persistent_kernel
from tunekit.kernels.gemm.splitk import _gemm_splitk_kernel, _splitk_reduce_kernel
from tunekit.kernels.gemm.tma import _gemm_tma_kernel

INTERPRETER_PROGRAMS = 4  # persistent/tma program count where the device reports no SM count (the interpreter)
REDUCE_BLOCK_M = 32
REDUCE_BLOCK_N = 128
REDUCE_WARPS = 4


def layout_of(t: torch.Tensor) -> str:
    """'row' when the last dim is unit-stride (or has one element), 'col' when the first is, else 'strided'."""
    rows, cols = t.shape
    if cols <= 1 or t.stride(1) == 1:
        return "row"
    if rows <= 1 or t.stride(0) == 1:
        return "col"
    return "strided"


def _leading_stride(t: torch.Tensor, layout: str) -> int:
    return t.stride(0) if layout == "row" else t.stride(1)


def tensors_aligned16(*tensors: torch.Tensor | None) -> bool:
    """Every given 2-D tensor is row- or column-major with a positive leading stride spanning a multiple of 16
    bytes, and every data pointer is 16-byte aligned (1-D tensors: the pointer only): what TMA's descriptors need.
    Together with `is_aligned16`'s sizes this is the aligned16 flag."""
    for t in tensors:
        if t is None:
            continue
        if t.data_ptr() % VECTOR_BYTES:
            return False
        if t.dim() == 2:
            layout = layout_of(t)
            if layout == "strided":
                return False
            lead = _leading_stride(t, layout)
            if lead <= 0 or lead * t.element_size() % VECTOR_BYTES:
                return False
    return True


def _span(t: torch.Tensor) -> int:
    """The largest element offset a kernel computes into t (strides times last index)."""
    return sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)


def _alignment(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, residual: torch.Tensor | None, a_col: bool, b_col: bool
) -> int:
    """The ALIGN constexpr: what divides N, K, every leading stride, and M where A is column-major."""
    m, k = a.shape
    values = [b.shape[1], k, c.stride(0), a.stride(1) if a_col else a.stride(0), b.stride(1) if b_col else b.stride(0)]
    if a_col:
        values.append(m)
    if residual is not None:
        values.append(residual.stride(0))
    return pow2_divisor(*values)


def _num_programs(tiles: int) -> int:
    sms = fingerprint().sm_count
    return max(1, min(tiles, sms if sms > 0 else INTERPRETER_PROGRAMS))


def _tma_descriptors(a: torch.Tensor, b: torch.Tensor, bm: int, bn: int, bk: int):
    """Host-side tensor descriptors over the unit-stride view of A and B (no allocator needed), or None when a
    tensor does not meet TMA's rules (16-byte aligned base, leading stride a multiple of 16 bytes). Sizes may be
    anything: loads past M, N or K zero-fill."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = b.shape[1]
    a_layout, b_layout = layout_of(a), layout_of(b)
    if "strided" in (a_layout, b_layout) or not tensors_aligned16(a, b) or min(m, n, k) == 0:
        return None
    if a_layout == "row":
        a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [bm, bk])
    else:
        a_desc = TensorDescriptor(a, [k, m], [a.stride(1), 1], [bk, bm])
    if b_layout == "row":
        b_desc = TensorDescriptor(b, [k, n], [b.stride(0), 1], [bk, bn])
    else:
        b_desc = TensorDescriptor(b, [n, k], [b.stride(1), 1], [bn, bk])
    return a_desc, b_desc, a_layout == "col", b_layout == "col"


def _staged(t: torch.Tensor) -> torch.Tensor:
    """t itself where TMA can describe it, else a copy of the same layout (strided: row-major) whose leading stride
    is rounded up to a multiple of 16 bytes. The copy is a view of t's shape: the padding is never read (TMA
    zero-fills past the described sizes, the plain kernels mask them), so it needs no zeros."""
    if tensors_aligned16(t):
        return t
    rows, cols = t.shape
    col = layout_of(t) == "col"
    per_vector = VECTOR_BYTES // t.element_size()
    lead = triton.cdiv(rows if col else cols, per_vector) * per_vector
    if col:
        buffer = torch.empty((cols, lead), device=t.device, dtype=t.dtype)[:, :rows].T
    else:
        buffer = torch.empty((rows, lead), device=t.device, dtype=t.dtype)[:, :cols]
    return buffer.copy_(t)


def _launch_tma(config: Config, inputs: Inputs, c: torch.Tensor, epilogue: dict, blocks: dict, options: dict) -> bool:
    """The tma kernel over descriptors of A and B; False (nothing launched) where TMA cannot describe them."""
    a, b, bias, residual, _, alpha, beta = inputs
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = blocks["BLOCK_M"], blocks["BLOCK_N"], blocks["BLOCK_K"]
    descriptors = _tma_descriptors(a, b, bm, bn, bk)
    if descriptors is None:
        return False
    a_desc, b_desc, a_col, b_col = descriptors
    programs = _num_programs(triton.cdiv(m, bm) * triton.cdiv(n, bn))
    _gemm_tma_kernel[(programs,)](
        a_desc, b_desc, c, c if bias is None else bias, c if residual is None else residual,
        m, n, k, c.stride(0), c.stride(1), *_strides(residual), float(alpha), float(beta), programs,
        A_COL=a_col, B_COL=b_col,
        # Not a parameter of the space: only tests/gpu/gemm_staged_probe.py sets it.
        WARP_SPECIALIZE=bool(config.get("WARP_SPECIALIZE", False)),
        **epilogue, **blocks, **options,
    )  # fmt: skip
    return True


def _launch_splitk(inputs: Inputs, c: torch.Tensor, split_k: int, epilogue: dict, blocks: dict, options: dict) -> None:
    """K split over SPLIT_K programs per tile into an fp32 workspace, then the reduce-and-epilogue kernel."""
    a, b, bias, residual, _, alpha, beta = inputs
    m, k = a.shape
    n = b.shape[1]
    bk = blocks["BLOCK_K"]
    a_col, b_col = layout_of(a) == "col", layout_of(b) == "col"
    layout = {"A_COL": a_col, "B_COL": b_col, "ALIGN": _alignment(a, b, c, residual, a_col, b_col)}
    tiles = triton.cdiv(m, blocks["BLOCK_M"]) * triton.cdiv(n, blocks["BLOCK_N"])
    k_per_split = triton.cdiv(triton.cdiv(k, bk), split_k) * bk
    ws = torch.empty((split_k, m, n), device=a.device, dtype=torch.float32)
    _gemm_splitk_kernel[(tiles, split_k)](
        a, b, ws, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), k_per_split,
        EVEN_K=k % bk == 0, **blocks, **layout, **options,
    )  # fmt: skip
    res_strides = _strides(residual)
    _splitk_reduce_kernel[(triton.cdiv(m, REDUCE_BLOCK_M), triton.cdiv(n, REDUCE_BLOCK_N))](
        ws, c, c if bias is None else bias, c if residual is None else residual,
        m, n, c.stride(0), c.stride(1), *res_strides, float(alpha), float(beta),
        SPLIT_K=split_k, BLOCK_M=REDUCE_BLOCK_M, BLOCK_N=REDUCE_BLOCK_N, BIG=blocks["BIG"],
        ALIGN=pow2_divisor(n, c.stride(0), *res_strides[:1]), num_warps=REDUCE_WARPS, **epilogue,
    )  # fmt: skip


def _strides(residual: torch.Tensor | None) -> tuple[int, int]:
    """The residual's strides; (0, 0) for none (its pointer argument is then C, never read)."""
    return (0, 0) if residual is None else (residual.stride(0), residual.stride(1))


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Write C for 2-D A [M, K] and B [K, N] of any strides. No validation: this is the hot path."""
    a, b, bias, residual, activation, alpha, beta = inputs
    (c,) = outputs
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    split_k = int(config["SPLIT_K"])
    variant = config["variant"] if k > 0 else "grouped"  # K == 0: no K loop to split or describe
    if variant == "staged":  # aligned copies of A and B for the tma kernel; C, bias and residual need none
        a, b, variant = _staged(a), _staged(b), "tma"
        inputs = (a, b, *inputs[2:])
    tensors = [t for t in (a, b, c, residual) if t is not None]
    big = max(_span(t) for t in tensors) > INT32_LIMIT or (variant == "splitk" and split_k * m * n > INT32_LIMIT)
    # An absent bias or residual still needs a pointer argument; the constexpr flag keeps it unread.
    epilogue = {"ACT": activation, "HAS_BIAS": bias is not None, "HAS_RESIDUAL": residual is not None}
    options = {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": int(config["GROUP_M"]), "BIG": big}
    blocks["DOT_IN_FP32"] = backend.INTERPRETED and a.dtype == torch.bfloat16
    if variant == "tma" and _launch_tma(config, inputs, c, epilogue, blocks, options):
        return
    # tma on operands it cannot describe (the op never dispatches tma then): the grouped kernel, same tiles.
    if variant == "splitk":
        _launch_splitk(inputs, c, split_k, epilogue, blocks, options)
        return
    a_col, b_col = layout_of(a) == "col", layout_of(b) == "col"
    layout = {"A_COL": a_col, "B_COL": b_col, "ALIGN": _alignment(a, b, c, residual, a_col, b_col)}
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    common = (a, b, c, c if bias is None else bias, c if residual is None else residual)
    common += (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    common += (*_strides(residual), float(alpha), float(beta))
    if variant == "persistent":
        programs = _num_programs(tiles)
        kernel, grid, extra = _gemm_persistent_kernel, programs, (programs,)
    else:
        kernel, grid, extra = _gemm_grouped_kernel, tiles, ()
    kernel[(grid,)](*common, *extra, EVEN_K=k % bk == 0, **epilogue, **blocks, **layout, **options)
