"""Search space of the LayerNorm forward kernel (kernels/layernorm.py).

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

from tunekit.search_spaces.row_window import WINDOW_ONLY_FOR_UNALIGNED_ROWS, window_block_n
from tunekit.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.spec import DTYPES

if TYPE_CHECKING:
    from tunekit.device import DeviceFingerprint

MAX_BLOCK_ELEMENTS = 65536
MAX_PER_THREAD_SINGLE = 64
MAX_PER_THREAD_LOOPED = 32  # a looped lane also carries its Welford mean and M2
MAX_CHUNKS = 16
WIDE_CHUNK = 4096
THREADS_PER_WARP = 32
HOLDS_ROWS = ("single", "window")  # variants keeping whole rows in registers (no loop)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def single_block_n(cols: int) -> int:
    """The block width a single-variant program needs for a row of `cols` (16 is the space's smallest)."""
    return max(16, next_pow2(cols))


def _tile(config: Config) -> int:
    return int(config["ROWS"]) * int(config["BLOCK_N"])


def _threads(config: Config) -> int:
    return THREADS_PER_WARP * int(config["num_warps"])


def _single_covers_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] == "window":
        return config["BLOCK_N"] == window_block_n(int(problem["cols"]), str(problem["dtype"]))
    return config["variant"] != "single" or config["BLOCK_N"] == single_block_n(int(problem["cols"]))


def _looped_needs_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "looped" or int(config["BLOCK_N"]) < int(problem["cols"])


def _looped_one_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "looped" or config["ROWS"] == 1


def _looped_few_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] != "looped":
        return True
    block_n = int(config["BLOCK_N"])
    return block_n * MAX_CHUNKS >= int(problem["cols"]) or block_n >= WIDE_CHUNK


def _single_one_stage(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] not in HOLDS_ROWS or config["num_stages"] == 1


def _tile_fits_registers(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return _tile(config) <= MAX_BLOCK_ELEMENTS


def _every_thread_busy(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return _tile(config) >= _threads(config) or config["num_warps"] == 1


def _no_spill(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    cap = MAX_PER_THREAD_SINGLE if config["variant"] in HOLDS_ROWS else MAX_PER_THREAD_LOOPED
    return _tile(config) <= cap * _threads(config)


def _rows_fit_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["ROWS"]) <= int(problem["rows"])


def _stages_fit_smem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["num_stages"] == 1 or device.smem_per_block == 0:  # the interpreter has no shared memory limit
        return True
    staged = (int(config["num_stages"]) - 1) * int(config["BLOCK_N"]) * DTYPES[str(problem["dtype"])].itemsize
    return staged <= device.smem_per_block


SPACE = SearchSpace(
    params=(
        Choice("variant", ("single", "looped", "window")),
        PowerOfTwo("BLOCK_N", 16, MAX_BLOCK_ELEMENTS),
        PowerOfTwo("ROWS", 1, 64),
        PowerOfTwo("num_warps", 1, 32),
        # Powers of two so the sampler sees the order; 3 stages rarely differs from 2 and 4 in a plain loop.
        PowerOfTwo("num_stages", 1, 4),
    ),
    rules=(
        Rule(
            "single_block_covers_row",
            _single_covers_row,
            why="single keeps a whole row in one block: BLOCK_N must be max(16, next_pow2(cols)), no more "
            "(window: the row plus one 16-byte vector of lead-in)",
        ),
        WINDOW_ONLY_FOR_UNALIGNED_ROWS,
        Rule(
            "looped_block_narrower_than_row",
            _looped_needs_chunks,
            why="one chunk is the single variant reading x twice",
        ),
        Rule(
            "looped_one_row_per_program",
            _looped_one_row,
            why="the looped variant handles one row per program",
        ),
        Rule(
            "looped_chunks_not_tiny",
            _looped_few_chunks,
            why="at most 16 chunks unless chunks are 4096+ wide: many narrow chunks are latency-bound",
        ),
        Rule(
            "single_one_stage",
            _single_one_stage,
            why="single has no loop to pipeline: other num_stages values compile to the same kernel",
        ),
        Rule(
            "tile_at_most_65536_elements",
            _tile_fits_registers,
            why="ROWS*BLOCK_N values live in registers; beyond 64Ki elements a program cannot hold them",
        ),
        Rule(
            "at_least_one_element_per_thread",
            _every_thread_busy,
            why="ROWS*BLOCK_N >= 32*num_warps, else whole warps idle (one warp is allowed for tiny rows)",
        ),
        Rule(
            "registers_do_not_spill",
            _no_spill,
            why="at most 64 values per thread (single) or 32 (looped: Welford state triples them); on an H200, "
            "128 per thread ran at 1/7-1/10 of the best bandwidth, looped at 64 per thread at 1/2 or less",
        ),
        Rule("rows_per_program_within_problem", _rows_fit_problem, why="ROWS > rows only adds masked-off rows"),
        Rule(
            "pipeline_stages_fit_shared_memory",
            _stages_fit_smem,
            why="each extra stage buffers one BLOCK_N chunk in shared memory",
        ),
    ),
)
