"""Search space of the softmax / log_softmax kernel (kernels/softmax.py), over the last dim of a 2-D tensor.

Four variants:
- `single`: a program holds ROWS whole rows in registers as one [ROWS, BLOCK_N] block (BLOCK_N >= cols): one read,
  one write.
- `window`: `single` for rows that are no whole number of 16-byte vectors, read and written through the aligned
  vectors containing them (search_spaces/row_window.py; BLOCK_N >= cols + one vector of lead-in).
- `online`: a program walks one row in BLOCK_N chunks twice: a running max and rescaled sum per lane (one pass),
  then normalise and write (second pass). Two reads of x.
- `looped`: the same chunks three times: max, then sum of exponentials, then write. One exponential fewer per
  element than `online` in the statistics pass, one more read of x (usually an L2 hit for one row).

The problem is a mapping with keys rows (a power-of-two bucket), cols (exact: alignment follows it), dtype, log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.search_spaces.row_window import WINDOW_ONLY_FOR_UNALIGNED_ROWS, window_block_n
from tunekit.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace

if TYPE_CHECKING:
    from tunekit.device import DeviceFingerprint

MIN_BLOCK_N = 16
MAX_BLOCK_ELEMENTS = 65536
MAX_ELEMENTS_PER_THREAD = 64
MAX_CHUNKS = 16
THREADS_PER_WARP = 32
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
LOOPED_VARIANTS = ("online", "looped")
HOLDS_ROWS = ("single", "window")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def single_block_n(cols: int) -> int:
    """The block width a single-variant program needs for a row of `cols` (16 is the space's smallest)."""
    return max(MIN_BLOCK_N, next_pow2(cols))


def _tile(config: Config) -> int:
    return int(config["ROWS"]) * int(config["BLOCK_N"])


def _threads(config: Config) -> int:
    return THREADS_PER_WARP * int(config["num_warps"])


def _single_covers_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] == "window":
        return config["BLOCK_N"] == window_block_n(int(problem["cols"]), str(problem["dtype"]))
    return config["variant"] != "single" or config["BLOCK_N"] == single_block_n(int(problem["cols"]))


def _looped_needs_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] not in LOOPED_VARIANTS or int(config["BLOCK_N"]) < int(problem["cols"])


def _looped_one_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] not in LOOPED_VARIANTS or config["ROWS"] == 1


def _looped_few_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] not in LOOPED_VARIANTS:
        return True
    block_n = int(config["BLOCK_N"])
    return block_n * MAX_CHUNKS >= int(problem["cols"]) or block_n == MAX_BLOCK_ELEMENTS


def _single_one_stage(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] not in HOLDS_ROWS or config["num_stages"] == 1


def _tile_fits_registers(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return _tile(config) <= MAX_BLOCK_ELEMENTS


def _every_thread_busy(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return _tile(config) >= _threads(config) or config["num_warps"] == 1


def _no_spill(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return _tile(config) <= MAX_ELEMENTS_PER_THREAD * _threads(config)


def _rows_fit_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["ROWS"]) <= int(problem["rows"])


def _stages_fit_smem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["num_stages"] == 1 or device.smem_per_block == 0:  # the interpreter has no shared memory limit
        return True
    staged = (int(config["num_stages"]) - 1) * int(config["BLOCK_N"]) * ELEMENT_BYTES[str(problem["dtype"])]
    return staged <= device.smem_per_block


SPACE = SearchSpace(
    params=(
        Choice("variant", ("single", "online", "looped", "window")),
        PowerOfTwo("BLOCK_N", MIN_BLOCK_N, MAX_BLOCK_ELEMENTS),
        PowerOfTwo("ROWS", 1, 64),
        PowerOfTwo("num_warps", 1, 32),
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
            why="one chunk is the single variant reading x several times",
        ),
        Rule("looped_one_row_per_program", _looped_one_row, why="online and looped handle one row per program"),
        Rule(
            "looped_at_most_16_chunks",
            _looped_few_chunks,
            why="many small chunks are latency-bound; the widest block is allowed for rows beyond 16 chunks",
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
            "at_most_64_elements_per_thread",
            _no_spill,
            why="x and its exponential per element: beyond 64 fp32 values per thread the registers spill",
        ),
        Rule("rows_per_program_within_problem", _rows_fit_problem, why="ROWS > rows only adds masked-off rows"),
        Rule(
            "pipeline_stages_fit_shared_memory",
            _stages_fit_smem,
            why="each extra stage buffers one BLOCK_N chunk in shared memory",
        ),
    ),
)
