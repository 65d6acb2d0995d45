"""Search space of the LayerNorm and RMSNorm backward kernels (kernels/layernorm_backward.py, rmsnorm_backward.py).

A backward program owns ROWS_PER_PROGRAM consecutive rows: it writes their dx and sums their dweight/dbias
contributions into one fp32 partial row of a workspace [programs, N]; a second small kernel then adds the partial
rows in a fixed order (deterministic, no atomics). Two variants:
- `single`: the program walks its rows as [ROWS, BLOCK_N] tiles holding whole rows (BLOCK_N >= cols), with the
  dweight/dbias sums kept in registers across tiles.
- `looped`: one row at a time in BLOCK_N chunks, twice (statistics, then dx); the partial sums are read, added
  to and written back chunk by chunk (a workspace row only its own program touches).

ROWS_PER_PROGRAM trades parallelism (more programs) against workspace traffic (more partial rows to reduce).

The problem is a mapping with keys rows (a power-of-two bucket), cols, dtype and flags (weight, bias); the rules
read rows, cols and dtype only, so RMSNorm's backward shares this space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import THREADS_PER_WARP, cdiv, prev_pow2, threads
from tunekit.search_spaces.rows import (
    AT_LEAST_ONE_ELEMENT_PER_THREAD,
    LOOPED_CHUNKS_NOT_TINY,
    looped_block_narrower_than_row,
    looped_one_row,
    single_covers_row,
    tile,
)

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

MAX_BLOCK_N = 8192  # the register budget below allows at most 8192 elements per program
REGISTERS_PER_BLOCK = 65536  # every NVIDIA part since sm_50; ptxas caps a thread at this / threads, and at 255
# Register use per thread measured with ptxas for sm_90 (Triton 3.6, bf16, LayerNorm): about 50 at 4 elements
# per thread, 95-110 at 8, 150-180 at 16 and 254 at 32, whatever the variant: ~24 + 7 per element.
REGISTER_BASE = 24
REGISTERS_PER_ELEMENT = 7
MAX_PER_THREAD_SINGLE = 32
MAX_PER_THREAD_LOOPED = 16  # a looped lane carries four Welford/co-moment accumulators besides x and dy*w
MAX_ROWS_PER_PROGRAM = 1024
# On a GPU: at least one program per SM (unless a program holds a single tile), at most this many per SM (the
# workspace the second kernel reads grows with the program count).
MAX_PROGRAMS_PER_SM = 16


def programs(config: Config, problem: Problem) -> int:
    """Programs launched for the rows bucket: each writes one partial row of the workspace."""
    return cdiv(int(problem["rows"]), int(config["ROWS_PER_PROGRAM"]))


def _whole_tiles_per_program(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["ROWS_PER_PROGRAM"]) >= int(config["ROWS"])


def max_per_thread(variant: str, num_warps: int) -> int:
    """Elements a thread may hold without spilling: 32 (single) or 16 (looped) up to 8 warps, 8 at 16, 4 at 32."""
    budget = min(255, REGISTERS_PER_BLOCK // (THREADS_PER_WARP * num_warps))
    fits = max(1, (budget - REGISTER_BASE) // REGISTERS_PER_ELEMENT)
    cap = MAX_PER_THREAD_SINGLE if variant == "single" else MAX_PER_THREAD_LOOPED
    return min(cap, prev_pow2(fits))


def _no_spill(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return tile(config) <= max_per_thread(str(config["variant"]), int(config["num_warps"])) * threads(config)


def _rows_fit_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["ROWS_PER_PROGRAM"]) <= int(problem["rows"])


def _fills_the_gpu(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if device.sm_count == 0 or config["ROWS_PER_PROGRAM"] == config["ROWS"]:  # 0: the interpreter
        return True
    return programs(config, problem) >= device.sm_count


def _workspace_small(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if device.sm_count == 0 or config["ROWS_PER_PROGRAM"] == MAX_ROWS_PER_PROGRAM:
        return True
    return programs(config, problem) <= MAX_PROGRAMS_PER_SM * device.sm_count


SPACE = SearchSpace(
    params=(
        Choice("variant", ("single", "looped")),
        PowerOfTwo("BLOCK_N", 16, MAX_BLOCK_N),
        PowerOfTwo("ROWS", 1, 32),
        PowerOfTwo("ROWS_PER_PROGRAM", 1, MAX_ROWS_PER_PROGRAM),
        PowerOfTwo("num_warps", 1, 32),
        # Triton 3.6 pipelines neither kernel's loads: num_stages 1, 2 and 4 compile to identical PTX (checked for
        # sm_90), so only 1 is searched. Widen this if a Triton release starts pipelining plain loads.
        PowerOfTwo("num_stages", 1, 1),
    ),
    rules=(
        Rule(
            "single_block_covers_row",
            single_covers_row,
            why="single keeps whole rows in one block: BLOCK_N must be max(16, next_pow2(cols)), no more",
        ),
        looped_block_narrower_than_row("and dy twice"),
        Rule("looped_one_row_per_tile", looped_one_row, why="the looped variant walks one row at a time"),
        LOOPED_CHUNKS_NOT_TINY,
        Rule(
            "whole_tiles_per_program",
            _whole_tiles_per_program,
            why="a program walks its ROWS_PER_PROGRAM rows ROWS at a time: ROWS_PER_PROGRAM >= ROWS",
        ),
        AT_LEAST_ONE_ELEMENT_PER_THREAD,
        Rule(
            "registers_do_not_spill",
            _no_spill,
            why="a thread holds ~24 + 7 registers per element within min(255, 65536 / threads): at most 32 elements "
            "per thread up to 8 warps, 8 at 16 warps, 4 at 32 (looped: at most 16, it keeps four accumulators)",
        ),
        Rule(
            "rows_per_program_within_problem",
            _rows_fit_problem,
            why="ROWS_PER_PROGRAM > rows only adds masked-off rows",
        ),
        Rule(
            "programs_fill_the_gpu",
            _fills_the_gpu,
            why="fewer programs than SMs leaves SMs idle (allowed when a program is one tile: it cannot be split)",
        ),
        Rule(
            "workspace_at_most_16_rows_per_sm",
            _workspace_small,
            why="every program adds a partial row for the second kernel to read; beyond 16 per SM use longer runs",
        ),
    ),
)
