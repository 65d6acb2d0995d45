"""Search space of the LayerNorm and RMSNorm backward kernels (kernels/norms/).

The backward grid is persistent: min(tiles, PROGRAMS_PER_SM × SMs) programs, each striding over row tiles and
keeping its dweight/dbias sums in fp32 registers until it writes one partial row of a workspace [programs, N]; a
second small kernel adds the partial rows in a fixed order (deterministic, no atomics). Two variants:
- `single`: [ROWS, BLOCK_N] tiles holding whole rows (BLOCK_N >= cols).
- `looped`: one row at a time in BLOCK_N chunks, twice (statistics, then dx), for rows too wide for registers;
  its partial row is read, added to and written back chunk by chunk.

PROGRAMS_PER_SM trades latency hiding (more resident programs) against workspace rows to reduce; the rules keep
only counts whose programs are resident at once and that change the launch.

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
    ROWS_WITHIN_PROBLEM,
    looped_block_narrower_than_row,
    looped_one_row,
    single_covers_row,
    tile,
)

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

MAX_BLOCK_N = 8192  # the register budget below allows at most 8192 elements per program
REGISTERS_PER_BLOCK = 65536  # every NVIDIA part since sm_50; ptxas caps a thread at this / threads, and at 255
# Register use per thread measured with ptxas for sm_90 (Triton 3.6, bf16, LayerNorm, persistent `single`): 80
# at 8 elements per thread (8 warps), 150 at 16 (4 warps), 244-255 at 32: ~24 + 7 per element where the budget
# allows. Where it does not, ptxas squeezes to ~8 + 7 without spilling: 8 per thread in 64 (32 warps) and 16 in
# 128 (16 warps; LayerNorm keeps 8 bytes of stack). The spill rule takes the floor, residency the typical use.
REGISTER_BASE = 24
REGISTER_FLOOR = 8
REGISTERS_PER_ELEMENT = 7
MAX_PER_THREAD_SINGLE = 32
MAX_PER_THREAD_LOOPED = 16  # a looped lane carries four Welford/co-moment accumulators besides x and dy*w
MAX_PROGRAMS_PER_SM = 8
MAX_WARPS_PER_SM = 64  # Hopper, Ampere (sm_80) and Volta; resident programs beyond it queue, breaking persistence
# The interpreter has no SMs: launches there count this many, so CPU tests run several programs and the reduction.
INTERPRETER_SMS = 2


def launch_sms(sm_count: int) -> int:
    """The SM count a launch sizes its persistent grid by (the interpreter's stand-in where there are none)."""
    return sm_count if sm_count > 0 else INTERPRETER_SMS


def row_tiles(config: Config, rows: int) -> int:
    """Work units along the rows: tiles of ROWS rows (single), single rows (looped)."""
    return cdiv(rows, int(config["ROWS"]) if config["variant"] == "single" else 1)


def persistent_programs(config: Config, rows: int, sm_count: int) -> int:
    """Programs a launch has: one per tile up to PROGRAMS_PER_SM per SM; each writes one workspace row."""
    return max(1, min(row_tiles(config, rows), int(config["PROGRAMS_PER_SM"]) * launch_sms(sm_count)))


def max_per_thread(variant: str, num_warps: int) -> int:
    """Elements a thread may hold without spilling: 32 (single) or 16 (looped) up to 8 warps, 16 at 16, 8 at 32."""
    budget = min(255, REGISTERS_PER_BLOCK // (THREADS_PER_WARP * num_warps))
    fits = max(1, (budget - REGISTER_FLOOR) // REGISTERS_PER_ELEMENT)
    cap = MAX_PER_THREAD_SINGLE if variant == "single" else MAX_PER_THREAD_LOOPED
    return min(cap, prev_pow2(fits))


def registers_per_thread(config: Config) -> int:
    """Typical registers per thread for the config's elements per thread (see above), within ptxas's caps."""
    budget = min(255, REGISTERS_PER_BLOCK // threads(config))
    return min(budget, REGISTER_BASE + REGISTERS_PER_ELEMENT * max(1, tile(config) // threads(config)))


def _no_spill(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return tile(config) <= max_per_thread(str(config["variant"]), int(config["num_warps"])) * threads(config)


def _programs_resident(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    per_sm = int(config["PROGRAMS_PER_SM"])
    if per_sm == 1:
        return True
    warps_fit = per_sm * int(config["num_warps"]) <= MAX_WARPS_PER_SM
    return warps_fit and per_sm * threads(config) * registers_per_thread(config) <= REGISTERS_PER_BLOCK


def _programs_have_work(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    per_sm = int(config["PROGRAMS_PER_SM"])
    if per_sm == 1:
        return True
    return row_tiles(config, int(problem["rows"])) > per_sm // 2 * launch_sms(device.sm_count)


SPACE = SearchSpace(
    params=(
        Choice("variant", ("single", "looped")),
        PowerOfTwo("BLOCK_N", 16, MAX_BLOCK_N),
        PowerOfTwo("ROWS", 1, 32),
        PowerOfTwo("PROGRAMS_PER_SM", 1, MAX_PROGRAMS_PER_SM),
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
        AT_LEAST_ONE_ELEMENT_PER_THREAD,
        Rule(
            "registers_do_not_spill",
            _no_spill,
            why="a thread holds ~8 + 7 registers per element within min(255, 65536 / threads): at most 32 elements "
            "per thread up to 8 warps, 16 at 16 warps, 8 at 32 (looped: at most 16, it keeps four accumulators)",
        ),
        ROWS_WITHIN_PROBLEM,
        Rule(
            "programs_per_sm_resident",
            _programs_resident,
            why="PROGRAMS_PER_SM programs must fit one SM at once (64 warps, 65536 registers), else the extra ones "
            "queue behind the first and the grid is no longer persistent",
        ),
        Rule(
            "programs_per_sm_have_work",
            _programs_have_work,
            why="with no more row tiles than (PROGRAMS_PER_SM / 2) × SMs the launch equals half the count's",
        ),
    ),
)
