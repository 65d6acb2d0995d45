"""Aligned-window access to rows that do not start on a 16-byte boundary (the row kernels' `window` variant).

A row of 4097 fp16 values starts 2 bytes further into a 16-byte vector than the row before it. Addressed from the
row's start, Triton cannot prove any alignment and issues one 2-byte load and store per element: every
implementation runs such rows at a quarter of the bandwidth. Here each program instead addresses its rows from the
16-byte boundary at or before the row's start (`base`), so loads and stores are whole aligned vectors, and masks
keep what belongs to the row:

- loads take every vector that overlaps the row (neighbouring rows' values are read and masked off, never written);
- stores write the vectors that lie wholly inside the row; the row's partial first and last vectors, which it
  shares with its neighbours, are stored element by element.

The block holding the last row loads element by element too: its last vector may pass the tensor's end.
Needs 16-byte aligned data pointers and equal row strides for input and output (`window_fits`).
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import torch
import triton
import triton.language as tl

from tunekit.kernels.common import VECTOR_BYTES


def window_fits(*tensors: torch.Tensor) -> bool:
    """Every tensor starts on a 16-byte boundary and all have the same row stride: one window serves them all."""
    first = tensors[0]
    return all(t.data_ptr() % VECTOR_BYTES == 0 and t.stride(0) == first.stride(0) for t in tensors)


@triton.jit
def row_window(M, N, stride, VEC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """This program's ROWS rows seen through aligned windows of BLOCK_N elements (BLOCK_N >= N + VEC - 1).

    Returns (offs, col, in_row, chunk_in, chunk_full, last): element offsets of the windows [ROWS, BLOCK_N]; each
    lane's column in its row; lanes holding the row; whole vectors overlapping the row; whole vectors inside it;
    whether this program holds the last row.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < M)[:, None]
    start = rows.to(tl.int64)[:, None] * stride  # int64: M * N may exceed 2**31 elements
    base = start // VEC * VEC  # Triton's alignment analysis sees the multiple of VEC: vector accesses
    lead = (start - base).to(tl.int32)  # the row's first lane, 0..VEC-1
    lanes = tl.arange(0, BLOCK_N)[None, :]
    chunk = lanes // VEC * VEC  # each lane's vector: masks built from it are constant per vector
    col = lanes - lead
    in_row = (col >= 0) & (col < N) & row_ok
    chunk_in = (chunk + VEC > lead) & (chunk < lead + N) & row_ok
    chunk_full = (chunk >= lead) & (chunk + VEC <= lead + N) & row_ok
    last = (tl.program_id(0) + 1) * ROWS >= M
    return base + lanes, col, in_row, chunk_in, chunk_full, last


@triton.jit
def row_window_load(X, offs, in_row, chunk_in, last):
    """fp32 values of the rows, 0 on lanes outside them."""
    # The last vector may pass the end of the tensor: element by element there. (A runtime branch: Triton turns
    # an if-block on a scalar into one, a conditional expression into both loads.)
    if last:  # noqa: SIM108
        x = tl.load(X + offs, mask=in_row, other=0.0)
    else:
        x = tl.load(X + offs, mask=chunk_in, other=0.0)
    return tl.where(in_row, x.to(tl.float32), 0.0)


@triton.jit
def store_row_window(Y, offs, y, in_row, chunk_full):
    """Store the rows' lanes: whole inner vectors at once, the two shared edge vectors element by element."""
    tl.store(Y + offs, y, mask=chunk_full)
    tl.store(Y + offs, y, mask=in_row & ~chunk_full)
