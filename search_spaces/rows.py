"""What the spaces of the row kernels share: LayerNorm, RMSNorm and softmax forward, LayerNorm/RMSNorm backward.

Each program of these kernels either holds whole rows in registers (`single`, and `window` for rows that start
inside a 16-byte vector: kernels/row_window.py) or walks one row in BLOCK_N chunks (`looped`, softmax's `online`).
Here: the block widths those variants need, when `window` applies, the rules the row spaces have in common (the
rules whose explanation differs per space are shared as predicates), and the forward spaces themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Predicate, Problem, Rule, SearchSpace
from tunekit.kernels.common import VECTOR_BYTES, element_bytes, next_pow2, vector_elements
from tunekit.search_spaces.common import (
    at_least_one_element_per_thread,
    stages_fit_shared_memory,
    tile_at_most_elements,
)

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

HOLDS_ROWS = ("single", "window")  # variants keeping whole rows in registers (no loop); every other one loops
MIN_BLOCK_N = 16  # the spaces' smallest BLOCK_N
MAX_BLOCK_ELEMENTS = 65536  # the forward spaces' largest register tile
MAX_CHUNKS = 16  # chunks per row a looped program walks, unless its chunks are the space's widest


def single_block_n(cols: int) -> int:
    """The block width a single-variant program needs for a row of `cols` (16 is the spaces' smallest)."""
    return max(MIN_BLOCK_N, next_pow2(cols))


def window_block_n(cols: int, dtype: str) -> int:
    """The block a window program needs: the row plus up to one vector of lead-in (16 is the spaces' smallest)."""
    return max(MIN_BLOCK_N, next_pow2(cols + vector_elements(dtype) - 1))


def rows_unaligned(problem: Problem) -> bool:
    """Rows are not a whole number of 16-byte vectors, so most rows start inside one."""
    return int(problem["cols"]) * element_bytes(str(problem["dtype"])) % VECTOR_BYTES != 0


def holds_rows(config: Config) -> bool:
    return config["variant"] in HOLDS_ROWS


def tile(config: Config) -> int:
    """Elements of a program's register tile: ROWS rows of BLOCK_N."""
    return int(config["ROWS"]) * int(config["BLOCK_N"])


def _chunk(config: Config) -> int:
    """Elements of a looped program's chunk of a row: what one pipeline stage buffers."""
    return int(config["BLOCK_N"])


def single_covers_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] == "window":
        return config["BLOCK_N"] == window_block_n(int(problem["cols"]), str(problem["dtype"]))
    return config["variant"] != "single" or config["BLOCK_N"] == single_block_n(int(problem["cols"]))


def _window_for_unaligned_rows(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "window" or rows_unaligned(problem)


def _looped_needs_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return holds_rows(config) or int(config["BLOCK_N"]) < int(problem["cols"])


def looped_one_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return holds_rows(config) or config["ROWS"] == 1


def looped_few_chunks(widest: int) -> Predicate:
    """At most MAX_CHUNKS chunks per row, unless the chunks are `widest` or wider (rows too long for that)."""

    def few_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
        block_n = int(config["BLOCK_N"])
        return holds_rows(config) or block_n * MAX_CHUNKS >= int(problem["cols"]) or block_n >= widest

    return few_chunks


def _single_one_stage(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return not holds_rows(config) or config["num_stages"] == 1


def _rows_fit_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["ROWS"]) <= int(problem["rows"])


SINGLE_BLOCK_COVERS_ROW = Rule(
    "single_block_covers_row",
    single_covers_row,
    why="single keeps a whole row in one block: BLOCK_N must be max(16, next_pow2(cols)), no more "
    "(window: the row plus one 16-byte vector of lead-in)",
)
WINDOW_ONLY_FOR_UNALIGNED_ROWS = Rule(
    "window_only_for_unaligned_rows",
    _window_for_unaligned_rows,
    why="rows of whole 16-byte vectors start on one: window would be single with a wider block",
)
SINGLE_ONE_STAGE = Rule(
    "single_one_stage",
    _single_one_stage,
    why="single has no loop to pipeline: other num_stages values compile to the same kernel",
)
TILE_AT_MOST_65536_ELEMENTS = tile_at_most_elements(
    MAX_BLOCK_ELEMENTS,
    tile,
    why="ROWS*BLOCK_N values live in registers; beyond 64Ki elements a program cannot hold them",
)
AT_LEAST_ONE_ELEMENT_PER_THREAD = at_least_one_element_per_thread(
    tile, why="ROWS*BLOCK_N >= 32*num_warps, else whole warps idle (one warp is allowed for tiny rows)"
)
ROWS_WITHIN_PROBLEM = Rule(
    "rows_per_program_within_problem", _rows_fit_problem, why="ROWS > rows only adds masked-off rows"
)
STAGES_FIT_SHARED_MEMORY = stages_fit_shared_memory(
    _chunk, why="each extra stage buffers one BLOCK_N chunk in shared memory"
)
LOOPED_ONE_ROW_PER_PROGRAM = Rule(
    "looped_one_row_per_program",
    looped_one_row,
    why="the looped variants (looped, online) handle one row per program",
)
LOOPED_CHUNKS_NOT_TINY = Rule(
    "looped_chunks_not_tiny",
    looped_few_chunks(4096),
    why="at most 16 chunks unless chunks are 4096+ wide: many narrow chunks are latency-bound",
)


def looped_block_narrower_than_row(reads: str) -> Rule:
    """A looped variant's chunk is narrower than the row: one chunk is `single` reading x `reads`."""
    return Rule(
        "looped_block_narrower_than_row",
        _looped_needs_chunks,
        why=f"one chunk is the single variant reading x {reads}",
    )


def forward_space(variants: tuple[str, ...], looped: tuple[Rule, ...], spill: Rule) -> SearchSpace:
    """The space of a row forward kernel: `variants` (single and window among them), the looped variants' rules
    (chunks narrower than the row, one row per program, not too many chunks) and the register rule."""
    return SearchSpace(
        params=(
            Choice("variant", variants),
            PowerOfTwo("BLOCK_N", MIN_BLOCK_N, MAX_BLOCK_ELEMENTS),
            PowerOfTwo("ROWS", 1, 64),
            PowerOfTwo("num_warps", 1, 32),
            # Powers of two so the sampler sees the order; 3 stages rarely differs from 2 and 4 in a plain loop.
            PowerOfTwo("num_stages", 1, 4),
        ),
        rules=(
            SINGLE_BLOCK_COVERS_ROW,
            WINDOW_ONLY_FOR_UNALIGNED_ROWS,
            *looped,
            SINGLE_ONE_STAGE,
            TILE_AT_MOST_65536_ELEMENTS,
            AT_LEAST_ONE_ELEMENT_PER_THREAD,
            spill,
            ROWS_WITHIN_PROBLEM,
            STAGES_FIT_SHARED_MEMORY,
        ),
    )
