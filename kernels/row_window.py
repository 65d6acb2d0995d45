"""Aligned-window access to rows that do not start on a 16-byte boundary (the row kernels' `window` variant).

A row of 4097 fp16 values starts 2 bytes further into a 16-byte vector than the row before it. Addressed from the
row's start, Triton cannot prove any alignment and issues one 2-byte load and store per element: every
implementation runs such rows at a quarter of the bandwidth. Here each program addresses its rows from the 16-byte
boundary at or before the row's start (`base`), so the bulk of every row moves in whole aligned vectors:

- loads take every vector that overlaps the row (neighbouring rows' values are read and masked off, never written);
- stores write the vectors that lie wholly inside the row; the row's partial first and last vectors, which it
  shares with its neighbours, are recomputed and stored element by element on a small [ROWS, 2 * VEC] edge tile;
- a vector that would pass the tensor's end (the last row's last one) is not loaded; the edge tile reads those few
  elements one by one and adds them to the statistics;
- a row's weights sit at a different lane in each row (lane = column + lead). `shifted` keeps VEC copies of a
  parameter vector, copy s shifted right by s lanes, so every row reads its own copy in aligned vectors too.

The masks of the bulk are built from whole vectors (`chunk`), which is what lets Triton's alignment analysis emit
16-byte accesses; a data-dependent branch would not (both sides of it get the element-wise layout).
Needs 16-byte aligned data pointers and equal row strides for input and output (`window_fits`).
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.backend  # noqa: F401

# isort: split

import threading
from collections import OrderedDict

import torch
import triton
import triton.language as tl

VECTOR_BYTES = 16
_SHIFTED_KEEP = 16  # parameter vectors whose shifted copies are kept (weights change rarely; a few models' worth)
_shifted: OrderedDict[tuple[object, ...], torch.Tensor] = OrderedDict()
_shifted_lock = threading.Lock()


def window_fits(*tensors: torch.Tensor) -> bool:
    """Every tensor starts on a 16-byte boundary and all have the same row stride: one window serves them all."""
    first = tensors[0]
    return all(t.data_ptr() % VECTOR_BYTES == 0 and t.stride(0) == first.stride(0) for t in tensors)


def shifted(param: torch.Tensor, vec: int, width: int) -> torch.Tensor:
    """[vec, width] copies of a contiguous 1-D parameter: row s holds param[j - s] at lane j, zeros elsewhere.

    Cached by storage, version and shape: an in-place update (an optimizer step) bumps the version and rebuilds.
    """
    key = (param.data_ptr(), param._version, param.dtype, param.device, param.numel(), vec, width)
    with _shifted_lock:
        found = _shifted.get(key)
        if found is not None:
            _shifted.move_to_end(key)
            return found
    n = param.numel()
    padded = torch.zeros(width + vec, dtype=param.dtype, device=param.device)
    padded[vec : vec + n] = param
    # Row r of this strided view starts r + 1 elements in: param shifted right by vec - 1 - r lanes.
    copies = padded.as_strided((vec, width), (1, 1), 1).flip(0).contiguous()
    with _shifted_lock:
        _shifted[key] = copies
        while len(_shifted) > _SHIFTED_KEEP:
            _shifted.popitem(last=False)
    return copies


@triton.jit
def row_window(M, N, stride, total, VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """This program's ROWS rows through aligned windows of BLOCK_N lanes (BLOCK_N >= N + VEC - 1).

    Returns (base, lead, lanes, valid, full, row_ok): each row's aligned start [ROWS, 1] (elements) and first
    lane; the lanes [1, BLOCK_N]; lanes holding a loaded value of the row; whole vectors inside the row; rows < M.
    Lanes load with mask `chunk_in`, which is `valid` widened to whole vectors.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < M)[:, None]
    start = rows.to(tl.int64)[:, None] * stride  # int64: M * N may exceed 2**31 elements
    base = start // VEC * VEC  # Triton's alignment analysis sees the multiple of VEC: vector accesses
    lead = (start - base).to(tl.int32)
    room = total - base  # elements from base to the tensor's end
    lanes = tl.arange(0, BLOCK_N)[None, :]
    chunk = lanes // VEC * VEC  # each lane's vector: masks built from it are constant per vector
    chunk_in = (chunk + VEC > lead) & (chunk < lead + N) & (chunk + VEC <= room) & row_ok
    full = (chunk >= lead) & (chunk + VEC <= lead + N) & row_ok
    valid = (lanes >= lead) & (lanes < lead + N) & chunk_in
    return base, lead, lanes, valid, chunk_in, full, row_ok


@triton.jit
def window_edges(base, lead, N, total, row_ok, VEC: tl.constexpr):
    """The row's partial first and last vectors as a [ROWS, 2 * VEC] tile of lanes, element-wise.

    Returns (lanes, store, unloaded): their lanes; those of the row the bulk does not store (the whole first
    vector unless the row starts on it, the last one's row part); those of the row the bulk did not load (past
    the last whole vector before the tensor's end).
    """
    j = tl.arange(0, 2 * VEC)[None, :]
    last = (lead + N) // VEC * VEC  # the vector holding the row's end (or just past it)
    lanes = tl.where(j < VEC, j, last + j - VEC)
    in_row = (lanes >= lead) & (lanes < lead + N) & row_ok
    head_full = (lead == 0) & (N >= VEC)
    store = in_row & ((j >= VEC) | ~head_full)
    unloaded = in_row & (j >= VEC) & (last + VEC > total - base)
    return lanes, store, unloaded
