"""Search space of the reduction kernels (kernels/reduction/reduction.py): sum, mean or max over one axis of a tensor.

The problem views the input as [batch, rows, cols] with unit stride along cols, and names the reduced axis:
- axis `inner`: reduce cols (the last, contiguous dim) of a 2-D [rows, cols] tensor; batch is always 1.
  Variant `inner`: a program owns BLOCK_M rows and walks them in [BLOCK_M, BLOCK_N] chunks along cols (one
  chunk when BLOCK_N >= cols), accumulating lane-wise in fp32 and reducing across lanes once at the end.
- axis `outer`: reduce rows of [batch, rows, cols] (dim 0 of a 2-D tensor when batch is 1, a middle dim
  otherwise). Variant `outer`: a program owns BLOCK_N columns of one batch and walks all rows in
  [BLOCK_M, BLOCK_N] chunks; loads are contiguous along cols. Variant `outer_split`: for few columns and many
  rows, SPLIT programs per column block each reduce a contiguous run of rows into an fp32 workspace, and a
  second small pass combines the SPLIT partials in a fixed order (deterministic: no atomics).

One tile, two meanings: BLOCK_M x BLOCK_N is the register tile of either family (rows per program for `inner`,
rows per chunk for `outer`). SPLIT is 1 except in `outer_split`, so no kernel is timed twice under two names.

The problem is a mapping with keys op (sum/mean/max), axis (inner/outer), batch (a power-of-two bucket; 1 for
inner), rows (a power-of-two bucket), cols (exact: the row stride, hence vector alignment, depends on it), dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import cdiv, next_pow2
from tunekit.search_spaces.common import (
    at_least_one_element_per_thread,
    at_most_elements_per_thread,
    stages_fit_shared_memory,
    tile_at_most_elements,
)

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

MAX_TILE = 16384  # fp32 accumulators (plus int32 indices for max) of one program
MAX_ELEMENTS_PER_THREAD = 64
MAX_INNER_CHUNKS = 64
MAX_BLOCK_M = 4096
MAX_BLOCK_N = 8192
MAX_SPLIT = 512
MIN_OUTER_BLOCK_N = 16  # 32 bytes of fp16 or 64 of fp32 per row of a chunk: whole sectors, coalesced


def rows_per_split(rows: int, split: int) -> int:
    return cdiv(rows, split)


def _tile(config: Config) -> int:
    return int(config["BLOCK_M"]) * int(config["BLOCK_N"])


def _is_inner(config: Config) -> bool:
    return config["variant"] == "inner"


def _variant_matches_axis(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return _is_inner(config) == (problem["axis"] == "inner")


def _split_only_when_split(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] == "outer_split":
        return int(config["SPLIT"]) >= 2
    return config["SPLIT"] == 1


def _block_n_within_cols(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_N"]) <= next_pow2(int(problem["cols"]))


def _block_m_within_rows(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    rows = int(problem["rows"])
    if config["variant"] == "outer_split":
        return int(config["SPLIT"]) * int(config["BLOCK_M"]) <= rows
    return int(config["BLOCK_M"]) <= next_pow2(rows)


def _inner_few_chunks(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if not _is_inner(config):
        return True
    block_n = int(config["BLOCK_N"])
    return cdiv(int(problem["cols"]), block_n) <= MAX_INNER_CHUNKS or block_n == MAX_BLOCK_N


def _outer_coalesced(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if _is_inner(config):
        return True
    return int(config["BLOCK_N"]) >= min(next_pow2(int(problem["cols"])), MIN_OUTER_BLOCK_N)


def loops(config: Config, problem: Problem) -> bool:
    """Whether a program walks more than one chunk (only then is there a loop to pipeline)."""
    if _is_inner(config):
        return int(config["BLOCK_N"]) < int(problem["cols"])
    return int(config["BLOCK_M"]) < rows_per_split(int(problem["rows"]), int(config["SPLIT"]))


def _stages_need_loop(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["num_stages"] == 1 or loops(config, problem)


SPACE = SearchSpace(
    params=(
        Choice("variant", ("inner", "outer", "outer_split")),
        PowerOfTwo("BLOCK_M", 1, MAX_BLOCK_M),
        PowerOfTwo("BLOCK_N", 1, MAX_BLOCK_N),
        PowerOfTwo("SPLIT", 1, MAX_SPLIT),
        PowerOfTwo("num_warps", 1, 16),
        PowerOfTwo("num_stages", 1, 4),
    ),
    rules=(
        Rule(
            "variant_matches_axis",
            _variant_matches_axis,
            why="axis inner runs variant inner; axis outer runs outer or outer_split",
        ),
        Rule(
            "split_only_in_outer_split",
            _split_only_when_split,
            why="SPLIT is 1 outside outer_split and at least 2 in it (one split is the plain outer kernel)",
        ),
        Rule("block_n_within_cols", _block_n_within_cols, why="BLOCK_N > next_pow2(cols) only adds masked lanes"),
        Rule(
            "block_m_within_rows",
            _block_m_within_rows,
            why="BLOCK_M > next_pow2(rows) only adds masked lanes; with a split every split gets a whole chunk",
        ),
        Rule(
            "inner_at_most_64_chunks",
            _inner_few_chunks,
            why="many small chunks along a row are latency-bound; the widest block is allowed beyond 64 chunks",
        ),
        Rule(
            "outer_block_n_coalesced",
            _outer_coalesced,
            why="outer loads rows of BLOCK_N contiguous columns: fewer than 16 wastes memory sectors",
        ),
        tile_at_most_elements(MAX_TILE, _tile, why="BLOCK_M*BLOCK_N fp32 accumulators live in registers"),
        at_least_one_element_per_thread(
            _tile, why="BLOCK_M*BLOCK_N >= 32*num_warps, else whole warps idle (one warp is allowed for tiny tiles)"
        ),
        at_most_elements_per_thread(
            MAX_ELEMENTS_PER_THREAD,
            _tile,
            why="an accumulator, an index (max) and a loaded value per element: beyond 64 per thread it spills",
        ),
        Rule("stages_need_a_loop", _stages_need_loop, why="a single chunk has no loop to pipeline"),
        stages_fit_shared_memory(_tile, why="each extra stage buffers one BLOCK_M x BLOCK_N chunk in shared memory"),
    ),
)
