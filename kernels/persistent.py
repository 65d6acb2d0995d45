"""What the persistent backward kernels share (kernels/norms/layernorm_backward.py, rmsnorm_backward.py,
pointwise/pointwise_backward.py): the jit kernel that adds up their partial column sums (dweight, dbias), the tiling
pattern their heuristics follow, and the torch baseline that times torch's backward alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tunekit.core.spec import Inputs
from tunekit.kernels.common import warps_for

# The partial-sum reduction: a program adds 32 columns (one 128-byte line of fp32 per partial row), 64 rows at a
# time, in partial-row order. It reads programs * N * 4 bytes per gradient (mostly from L2, just written):
# PROGRAMS_PER_SM sets the program count, so the tuner weighs this traffic against latency hiding.
SUM_BLOCK_N = 32
SUM_BLOCK_G = 64
SUM_WARPS = 4


@triton.jit
def _sum_partials(
    DW_PART,  # [G, N] fp32 partial dweight sums, contiguous (read only when WANT_DW)
    DB_PART,  # [G, N] fp32 partial dbias sums, contiguous (read only when WANT_DB)
    DW,  # [N] dweight (written when WANT_DW)
    DB,  # [N] dbias (written when WANT_DB)
    G, N,
    WANT_DW: tl.constexpr, WANT_DB: tl.constexpr, DIV: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    N = N // DIV * DIV  # see norms/layernorm_backward_jit.py: partial rows N apart keep 16-byte loads when DIV allows
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc_w = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        parts = g0 + tl.arange(0, BLOCK_G)
        mask = (parts < G)[:, None] & col_mask[None, :]
        offs = parts.to(tl.int64)[:, None] * N + cols[None, :]
        if WANT_DW:
            acc_w += tl.load(DW_PART + offs, mask=mask, other=0.0)
        if WANT_DB:
            acc_b += tl.load(DB_PART + offs, mask=mask, other=0.0)
    if WANT_DW:
        tl.store(DW + cols, tl.sum(acc_w, axis=0).to(DW.dtype.element_ty), mask=col_mask)
    if WANT_DB:
        tl.store(DB + cols, tl.sum(acc_b, axis=0).to(DB.dtype.element_ty), mask=col_mask)


@dataclass(frozen=True)
class PersistentTiling:
    """The sweep's pattern for a persistent backward grid (also the pointwise backward's heuristic)."""

    tile_bytes: int  # tiles of at least this many bytes
    thread_bytes: int  # bytes of a tile per thread
    warps_per_sm: int  # resident warps per SM, in programs of a tile each

    def tile_rows(self, width: int, element_size: int, most: int) -> int:
        """Rows per tile of `width` elements: enough for tile_bytes, at most `most` (a power of two) and 32."""
        return min(max(1, self.tile_bytes // element_size // width), most, 32)

    def warps(self, elements: int, element_size: int) -> int:
        return warps_for(elements, self.thread_bytes // element_size, 32)

    def programs_per_sm(self, warps: int) -> int:
        return max(1, self.warps_per_sm // warps)


# The baseline times torch's backward alone: its forward graph is built once per inputs and kept (one entry).
_BASELINE_GRAPH: dict[int, tuple[Inputs, torch.Tensor, list[torch.Tensor]]] = {}


def autograd_baseline(
    inputs: Inputs, forward: Callable[[Inputs], tuple[torch.Tensor, list[torch.Tensor]]]
) -> tuple[torch.Tensor, ...]:
    """The gradients of `forward(inputs)` = (y, leaves) for the upstream gradient inputs[1], by torch's autograd;
    the forward graph of the latest inputs is kept, so repeated calls time the backward alone."""
    cached = _BASELINE_GRAPH.get(id(inputs))
    if cached is None or cached[0] is not inputs:
        _BASELINE_GRAPH.clear()
        cached = _BASELINE_GRAPH[id(inputs)] = (inputs, *forward(inputs))
    _, y, leaves = cached
    return torch.autograd.grad(y, leaves, inputs[1], retain_graph=True)


# The norm backwards' sweep on an H200 (kernels/norms/layernorm_backward.py says more): 64 bytes of a tile per thread
# in tiles of at least 8 KiB, 8 warps per SM. The pointwise backward follows the same pattern.
TILING = PersistentTiling(tile_bytes=8192, thread_bytes=64, warps_per_sm=8)
