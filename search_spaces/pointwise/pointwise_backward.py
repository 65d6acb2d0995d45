"""Search space of the pointwise backward kernel (kernels/pointwise/pointwise_backward.py): d_input and d_bias of
y = act(input * scale + bias) + residual.

The kernel tiles input viewed as [M, N] into [ROWS, BLOCK_N] tiles; BLOCK_N need not cover the row (wide rows
take several column tiles). With a bias the grid is persistent: each column tile gets `row_programs` programs
(PROGRAMS_PER_SM × SMs in all, split over the column tiles), each striding over row tiles and keeping its d_bias
sums in fp32 registers until it writes one partial row of a workspace [row_programs, N]; LayerNorm backward's
`_sum_partials` adds those rows in a fixed order (deterministic, no atomics). Without a bias nothing is summed:
the kernel sees the flat tensor as one row of numel elements, one program per BLOCK_N of them (a plain
elementwise grid; ROWS and PROGRAMS_PER_SM are pinned to 1 by the rules below).

The problem is a mapping with keys rows, cols, dtype, activation and bias. With a bias: rows is a power-of-two
bucket of M and cols is N. Without: rows is 1 and cols a power-of-two bucket of numel (the row the kernel sees).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import cdiv, element_bytes, threads
from tunekit.search_spaces.norms.layernorm_backward import MAX_BLOCK_N, MAX_PROGRAMS_PER_SM, launch_sms, max_per_thread
from tunekit.search_spaces.norms.layernorm_backward import SPACE as NORM_BACKWARD_SPACE
from tunekit.search_spaces.rows import AT_LEAST_ONE_ELEMENT_PER_THREAD, ROWS_WITHIN_PROBLEM, single_block_n, tile

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

LINE_BYTES = 128  # one L2 cache line: a narrower column tile splits every line of a row between programs


def row_programs(config: Config, rows: int, cols: int, sm_count: int) -> int:
    """Programs per column tile: PROGRAMS_PER_SM × SMs shared by the column tiles, at most one per row tile (and
    at least one, so a row wider than the budget still gets a program per column tile). Each writes one
    workspace row."""
    col_tiles = cdiv(cols, int(config["BLOCK_N"]))
    budget = int(config["PROGRAMS_PER_SM"]) * launch_sms(sm_count)
    return max(1, min(cdiv(rows, int(config["ROWS"])), budget // col_tiles))


def _block_within_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_N"]) <= single_block_n(int(problem["cols"]))


def _block_at_least_a_line(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    block_n = int(config["BLOCK_N"])
    covers_row = block_n == single_block_n(int(problem["cols"]))
    return covers_row or block_n * element_bytes(str(problem["dtype"])) >= LINE_BYTES


def _no_spill(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return tile(config) <= max_per_thread("single", int(config["num_warps"])) * threads(config)


def _column_tiles_fit_grid(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if not problem["bias"] or config["BLOCK_N"] == MAX_BLOCK_N:
        return True  # a plain grid, one program per tile; or rows too wide for any persistent grid
    return cdiv(int(problem["cols"]), int(config["BLOCK_N"])) <= MAX_PROGRAMS_PER_SM * launch_sms(device.sm_count)


def _programs_have_work(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    per_sm = int(config["PROGRAMS_PER_SM"])
    if per_sm == 1:
        return True
    rows, cols = int(problem["rows"]), int(problem["cols"])
    half = {**config, "PROGRAMS_PER_SM": per_sm // 2}
    return row_programs(config, rows, cols, device.sm_count) > row_programs(half, rows, cols, device.sm_count)


# LayerNorm backward's residency rule reads the register tile and warps only: it holds here as it is.
PROGRAMS_PER_SM_RESIDENT = next(r for r in NORM_BACKWARD_SPACE.rules if r.name == "programs_per_sm_resident")

SPACE = SearchSpace(
    params=(
        PowerOfTwo("BLOCK_N", 16, MAX_BLOCK_N),
        PowerOfTwo("ROWS", 1, 32),
        PowerOfTwo("PROGRAMS_PER_SM", 1, MAX_PROGRAMS_PER_SM),
        PowerOfTwo("num_warps", 1, 32),
        # The loop's loads are prefetched by hand (the next tile's, before this tile's math); Triton pipelines
        # none of them, so other num_stages values compile to the same kernel.
        Choice("num_stages", (1,)),
    ),
    rules=(
        Rule(
            "block_within_row",
            _block_within_row,
            why="BLOCK_N <= max(16, next_pow2(cols)): a wider column tile only adds masked-off lanes",
        ),
        Rule(
            "column_tile_at_least_a_line",
            _block_at_least_a_line,
            why="BLOCK_N covers the row or spans a 128-byte line: narrower tiles split every line between programs",
        ),
        AT_LEAST_ONE_ELEMENT_PER_THREAD,
        Rule(
            "registers_do_not_spill",
            _no_spill,
            why="as LayerNorm backward's single variant (a tile and its prefetched successor in registers): at "
            "most 32 elements per thread up to 8 warps, 16 at 16 warps, 8 at 32",
        ),
        ROWS_WITHIN_PROBLEM,
        Rule(
            "column_tiles_fit_persistent_grid",
            _column_tiles_fit_grid,
            why="with a bias, at most 8 × SMs column tiles (unless BLOCK_N is the widest): past that programs "
            "queue behind the resident ones, each walking every row, and the grid is no longer persistent",
        ),
        PROGRAMS_PER_SM_RESIDENT,
        Rule(
            "programs_per_sm_have_work",
            _programs_have_work,
            why="PROGRAMS_PER_SM > 1 must give a column tile more programs than half the count does (never "
            "without a bias: one row, one program per tile)",
        ),
    ),
)
