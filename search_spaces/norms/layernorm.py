"""Search space of the LayerNorm forward kernel (kernels/norms/layernorm.py).

Three variants:
- `single`: a program holds ROWS whole rows in registers as one [ROWS, BLOCK_N] block (BLOCK_N >= cols).
- `looped`: a program walks one row in BLOCK_N chunks, twice (statistics, then normalise); for rows wider than
  one block, or where a whole row would spill registers.
- `window`: `single` for rows whose length is not a whole number of 16-byte vectors (2^k±1 widths). Such rows
  start anywhere inside a 16-byte vector, so row-relative loads go element by element; `window` reads each row
  through the 16-byte aligned window that contains it (BLOCK_N >= cols + one vector) and masks the neighbours' values.

The problem is a mapping with keys rows (a power-of-two bucket), cols, dtype, weight, bias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Config, Problem, Rule
from tunekit.kernels.common import threads
from tunekit.search_spaces.rows import (
    LOOPED_CHUNKS_NOT_TINY,
    LOOPED_ONE_ROW_PER_PROGRAM,
    forward_space,
    holds_rows,
    looped_block_narrower_than_row,
    tile,
)

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

MAX_PER_THREAD_SINGLE = 64
MAX_PER_THREAD_LOOPED = 32  # a looped lane also carries its Welford mean and M2


def _no_spill(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    cap = MAX_PER_THREAD_SINGLE if holds_rows(config) else MAX_PER_THREAD_LOOPED
    return tile(config) <= cap * threads(config)


SPACE = forward_space(
    ("single", "looped", "window"),
    looped=(looped_block_narrower_than_row("twice"), LOOPED_ONE_ROW_PER_PROGRAM, LOOPED_CHUNKS_NOT_TINY),
    spill=Rule(
        "registers_do_not_spill",
        _no_spill,
        why="at most 64 values per thread (single) or 32 (looped: Welford state triples them); on an H200, "
        "128 per thread ran at 1/7-1/10 of the best bandwidth, looped at 64 per thread at 1/2 or less",
    ),
)
