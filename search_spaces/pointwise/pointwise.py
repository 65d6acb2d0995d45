"""Search space of the fused pointwise kernel (kernels/pointwise/pointwise.py): y = act(x * scale + bias) + residual.

Two variants:
- `flat`: one 1-D run of BLOCK contiguous elements per program over x.numel(); the bias column of element i is
  i % N. Every x/residual/y access is a contiguous, 16-byte vectorisable run whatever N is, but a bias costs an
  integer modulo and a (cached) gather per element. Without a bias it is the only sensible layout.
- `rows`: a [BLOCK // BLOCK_N, BLOCK_N] tile of x viewed as [M, N]. The bias is one contiguous BLOCK_N vector per
  tile, loaded once and broadcast over the tile's rows: no modulo, no gather. Rows start at multiples of N, so
  x loads vectorise only when N is a multiple of 16 (hence `aligned16` in the problem key).
Neither wins everywhere (the modulo and gather cost ALU/LSU issue slots, which bite when a heavy activation on
2-byte data is close to compute-bound; ragged or narrow rows waste `rows` lanes), so the tuner picks.

There is no loop in either kernel, so num_stages has nothing to pipeline: it is a one-value parameter, kept so
the launch option is recorded with the config. BLOCK_N is meaningful for `rows` only; `flat` configs carry
BLOCK_N == BLOCK (a 1 x BLOCK tile), so no kernel is timed twice under two names.

The problem is a mapping with keys numel (a power-of-two bucket of x.numel()), cols (N, the bias length; 0 when
there is no bias, where the last dim does not matter), aligned16 (cols % 16 == 0), dtype, activation, has_bias,
has_residual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import cdiv, next_pow2
from tunekit.search_spaces.common import at_least_one_element_per_thread, at_most_elements_per_thread

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

# The activations the kernel fuses, by the name a problem and the ops use (a constexpr flag in the kernel).
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")

MIN_BLOCK = 128
MAX_BLOCK = 16384
MIN_BLOCK_N = 16
MAX_ELEMENTS_PER_THREAD = 64


def problem_rows(problem: Problem) -> int:
    """Rows of the [M, N] view: numel / cols rounded up (1 when there is no bias)."""
    cols = int(problem["cols"])
    return 1 if cols <= 0 else max(1, cdiv(int(problem["numel"]), cols))


def _block(config: Config) -> int:
    """Elements of a program's tile: BLOCK, flat or as [BLOCK // BLOCK_N, BLOCK_N] rows."""
    return int(config["BLOCK"])


def _block_within_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK"]) <= max(MIN_BLOCK, next_pow2(int(problem["numel"])))


def _flat_block_n_is_block(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "flat" or config["BLOCK_N"] == config["BLOCK"]


def _rows_needs_bias(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "rows" or bool(problem["has_bias"])


def _rows_tile_fits_block(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "rows" or int(config["BLOCK_N"]) <= int(config["BLOCK"])


def _rows_tile_within_row(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] != "rows":
        return True
    return int(config["BLOCK_N"]) <= max(MIN_BLOCK_N, next_pow2(int(problem["cols"])))


def _rows_tile_within_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    if config["variant"] != "rows":
        return True
    return int(config["BLOCK"]) // int(config["BLOCK_N"]) <= next_pow2(problem_rows(problem))


SPACE = SearchSpace(
    params=(
        Choice("variant", ("flat", "rows")),
        PowerOfTwo("BLOCK", MIN_BLOCK, MAX_BLOCK),
        PowerOfTwo("BLOCK_N", MIN_BLOCK_N, MAX_BLOCK),
        PowerOfTwo("num_warps", 1, 16),
        Choice("num_stages", (1,)),
    ),
    rules=(
        # BLOCK >= MIN_BLOCK = 4 warps' worth: the rule's one-warp allowance never applies here.
        at_least_one_element_per_thread(
            _block, why="BLOCK >= 32*num_warps, else whole warps hold only masked-off lanes"
        ),
        at_most_elements_per_thread(
            MAX_ELEMENTS_PER_THREAD,
            _block,
            why="BLOCK/(32*num_warps) <= 64: x, residual and the fp32 temporaries must stay in registers",
        ),
        Rule(
            "block_within_problem",
            _block_within_problem,
            why="BLOCK <= max(128, next_pow2(numel)): a wider tile only adds masked-off lanes",
        ),
        Rule(
            "flat_block_n_is_block",
            _flat_block_n_is_block,
            why="flat has no column tile; its configs carry BLOCK_N == BLOCK so one kernel has one name",
        ),
        Rule(
            "rows_needs_bias",
            _rows_needs_bias,
            why="without a bias there is nothing to load once per column tile: rows is flat with extra index math",
        ),
        Rule("rows_tile_fits_block", _rows_tile_fits_block, why="rows tiles are [BLOCK // BLOCK_N, BLOCK_N]"),
        Rule(
            "rows_tile_within_row",
            _rows_tile_within_row,
            why="BLOCK_N <= max(16, next_pow2(cols)): a wider column tile only adds masked-off lanes",
        ),
        Rule(
            "rows_tile_within_problem",
            _rows_tile_within_problem,
            why="BLOCK // BLOCK_N <= next_pow2(rows): more rows per tile than the problem has are masked off",
        ),
    ),
)
