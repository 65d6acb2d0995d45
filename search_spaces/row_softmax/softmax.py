"""Search space of the softmax / log_softmax kernel (kernels/row_softmax/softmax.py), over the last dim of a 2-D tensor.

Four variants:
- `single`: a program holds ROWS whole rows in registers as one [ROWS, BLOCK_N] block (BLOCK_N >= cols): one read,
  one write.
- `window`: `single` for rows that are no whole number of 16-byte vectors, read and written through the aligned
  vectors containing them (search_spaces/rows.py; BLOCK_N >= cols + one vector of lead-in).
- `online`: a program walks one row in BLOCK_N chunks twice: a running max and rescaled sum per lane (one pass),
  then normalise and write (second pass). Two reads of x.
- `looped`: the same chunks three times: max, then sum of exponentials, then write. One exponential fewer per
  element than `online` in the statistics pass, one more read of x (usually an L2 hit for one row).

The problem is a mapping with keys rows (a power-of-two bucket), cols (exact: alignment follows it), dtype, log.
"""

from __future__ import annotations

from tunekit.core.space import Rule
from tunekit.search_spaces.common import at_most_elements_per_thread
from tunekit.search_spaces.rows import (
    LOOPED_ONE_ROW_PER_PROGRAM,
    MAX_BLOCK_ELEMENTS,
    forward_space,
    looped_block_narrower_than_row,
    looped_few_chunks,
    tile,
)

MAX_ELEMENTS_PER_THREAD = 64

SPACE = forward_space(
    ("single", "online", "looped", "window"),
    looped=(
        looped_block_narrower_than_row("several times"),
        LOOPED_ONE_ROW_PER_PROGRAM,
        Rule(
            "looped_at_most_16_chunks",
            looped_few_chunks(MAX_BLOCK_ELEMENTS),
            why="many small chunks are latency-bound; the widest block is allowed for rows beyond 16 chunks",
        ),
    ),
    spill=at_most_elements_per_thread(
        MAX_ELEMENTS_PER_THREAD,
        tile,
        why="x and its exponential per element: beyond 64 fp32 values per thread the registers spill",
    ),
)
