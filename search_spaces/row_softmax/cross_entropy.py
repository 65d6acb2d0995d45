"""Search space of the fused cross-entropy kernel (kernels/row_softmax/): loss and d(loss)/d(logits) of 2-D
logits [rows, cols] (cols: the vocabulary) in one forward.

Two variants, the row forward kernels' (search_spaces/rows.py):
- `single`: a program holds ROWS whole rows in registers as one [ROWS, BLOCK_N] block: one read of the logits,
  one write of the gradient.
- `online`: a program walks one row in BLOCK_N chunks: a running max and rescaled sum per lane (first read),
  then the gradient softmax - onehot (second read, usually an L2 hit for one row, and the write).

The problem is a mapping with keys rows (a power-of-two bucket), cols (exact), dtype, reduction.
"""

from __future__ import annotations

from tunekit.search_spaces.common import at_most_elements_per_thread
from tunekit.search_spaces.rows import (
    LOOPED_CHUNKS_NOT_TINY,
    LOOPED_ONE_ROW_PER_PROGRAM,
    forward_space,
    looped_block_narrower_than_row,
    tile,
)

MAX_ELEMENTS_PER_THREAD = 64

SPACE = forward_space(
    ("single", "online"),
    looped=(looped_block_narrower_than_row("twice"), LOOPED_ONE_ROW_PER_PROGRAM, LOOPED_CHUNKS_NOT_TINY),
    spill=at_most_elements_per_thread(
        MAX_ELEMENTS_PER_THREAD,
        tile,
        why="logits and their exponential per element: beyond 64 fp32 values per thread the registers spill",
    ),
)
