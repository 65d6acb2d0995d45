"""Search space of the fused SwiGLU kernel (kernels/glu/swiglu.py): y = silu(gate) * up over [M, N] rows.

One program computes a [ROWS, BLOCK_N] tile: ROWS rows of the M (tokens), BLOCK_N columns of the N (the MLP's
intermediate size); the grid is row blocks x column blocks. Every element is read once and written once, so the
kernel streams memory: the tile trades the bytes one program keeps in flight and the width of its contiguous runs
(a wide BLOCK_N) against programs per SM and masked-off lanes where N has no large power-of-two factor (11008 =
43 x 256). There is no loop, so there is nothing for num_stages to pipeline: not a parameter.

The problem is a mapping with keys rows (a power-of-two bucket of M), cols (N, exact) and dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import cdiv, next_pow2
from tunekit.search_spaces.common import (
    at_least_one_element_per_thread,
    at_most_elements_per_thread,
    tile_at_most_elements,
)
from tunekit.search_spaces.rows import ROWS_WITHIN_PROBLEM, tile

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

MIN_BLOCK_N = 16
MAX_BLOCK_N = 8192
MAX_ROWS = 64
MAX_TILE = 16384
MAX_ELEMENTS_PER_THREAD = 32  # gate, up and the fp32 result of each in registers
# Column blocks are the grid's second axis, which CUDA limits to 65535 blocks: the widest row a config can cover is
# MAX_BLOCK_N * MAX_COLUMN_TILES (the op runs torch's formula past it).
MAX_COLUMN_TILES = 65535
MAX_COLS = MAX_BLOCK_N * MAX_COLUMN_TILES


def _block_n_within_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_N"]) <= max(MIN_BLOCK_N, next_pow2(int(problem["cols"])))


def _column_tiles_fit_grid(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return cdiv(int(problem["cols"]), int(config["BLOCK_N"])) <= MAX_COLUMN_TILES


SPACE = SearchSpace(
    params=(
        PowerOfTwo("BLOCK_N", MIN_BLOCK_N, MAX_BLOCK_N),
        PowerOfTwo("ROWS", 1, MAX_ROWS),
        PowerOfTwo("num_warps", 1, 16),
    ),
    rules=(
        tile_at_most_elements(
            MAX_TILE, tile, why=f"ROWS*BLOCK_N <= {MAX_TILE}: a wider tile only adds registers to a memory-bound stream"
        ),
        at_least_one_element_per_thread(
            tile, why="ROWS*BLOCK_N >= 32*num_warps, else whole warps idle (one warp is allowed for tiny tiles)"
        ),
        at_most_elements_per_thread(
            MAX_ELEMENTS_PER_THREAD,
            tile,
            why=f"ROWS*BLOCK_N/(32*num_warps) <= {MAX_ELEMENTS_PER_THREAD}: gate, up and the fp32 temporaries must "
            "stay in registers",
        ),
        Rule(
            "block_n_within_row",
            _block_n_within_row,
            why="BLOCK_N <= max(16, next_pow2(cols)): a wider column tile only adds masked-off lanes",
        ),
        ROWS_WITHIN_PROBLEM,
        Rule(
            "column_tiles_fit_grid",
            _column_tiles_fit_grid,
            why=f"cdiv(cols, BLOCK_N) <= {MAX_COLUMN_TILES}: column blocks are the grid's second axis",
        ),
    ),
)
