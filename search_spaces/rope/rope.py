"""Search space of the rotary position embedding kernels (kernels/rope/rope.py forward, kernels/rope/rope_backward.py).

One program rotates a [BLOCK_R, BLOCK_H, D] tile of q and the same rows and head range of k: BLOCK_R of the
B * S rows, BLOCK_H heads, the whole head dim D (two halves of BLOCK_D = next_pow2(D / 2) lanes, not a parameter:
a row's halves must be in one program). cos and sin are loaded once per program and reused over its heads and
over q and k, which is what the fusion saves. The tiles along rows and heads trade cos/sin reuse and vector width
against programs per SM, so the tuner picks them. There is no loop in the kernel: num_stages has nothing to
pipeline and is a one-value parameter, kept so the launch option is recorded with the config.

The problem is a mapping with keys rows (a power-of-two bucket of B * S), q_heads, k_heads, head_dim (D, even),
dtype and heads_inner (q's head stride at most its sequence stride: a [B, S, H, D] buffer, as projections write
it, whether or not the op got it transposed; it decides which tile dimension walks contiguous memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.kernels.common import next_pow2, threads

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

MAX_BLOCK_R = 64
MAX_BLOCK_H = 64
MAX_ELEMENTS_PER_THREAD = 64  # of one of q's or k's tiles: x, its rotated half and fp32 temporaries in registers


def half_block(problem: Problem) -> int:
    """Lanes of one half of the head dim: next_pow2(D / 2)."""
    return next_pow2(int(problem["head_dim"]) // 2)


def max_heads(problem: Problem) -> int:
    return max(int(problem["q_heads"]), int(problem["k_heads"]))


def tile_elements(config: Config, problem: Problem) -> int:
    """Elements of a program's q tile (padded): BLOCK_R x BLOCK_H x 2 * BLOCK_D."""
    return int(config["BLOCK_R"]) * int(config["BLOCK_H"]) * 2 * half_block(problem)


def _rows_within_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_R"]) <= next_pow2(int(problem["rows"]))


def _heads_within_problem(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return int(config["BLOCK_H"]) <= next_pow2(max_heads(problem))


def _every_thread_busy(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return tile_elements(config, problem) >= threads(config) or config["num_warps"] == 1


def _few_elements_per_thread(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return tile_elements(config, problem) <= MAX_ELEMENTS_PER_THREAD * threads(config)


SPACE = SearchSpace(
    params=(
        PowerOfTwo("BLOCK_R", 1, MAX_BLOCK_R),
        PowerOfTwo("BLOCK_H", 1, MAX_BLOCK_H),
        PowerOfTwo("num_warps", 1, 16),
        Choice("num_stages", (1,)),
    ),
    rules=(
        Rule(
            "at_least_one_element_per_thread",
            _every_thread_busy,
            why="the q tile holds an element per thread, else whole warps idle (one warp may idle lanes)",
        ),
        Rule(
            f"at_most_{MAX_ELEMENTS_PER_THREAD}_elements_per_thread",
            _few_elements_per_thread,
            why=f"the q tile holds at most {MAX_ELEMENTS_PER_THREAD} elements per thread: x, its other half and "
            "fp32 temporaries stay in registers (k's tile is no larger)",
        ),
        Rule(
            "rows_within_problem",
            _rows_within_problem,
            why="BLOCK_R <= next_pow2(rows): more rows per program than the problem has are masked off",
        ),
        Rule(
            "heads_within_problem",
            _heads_within_problem,
            why="BLOCK_H <= next_pow2(max(q_heads, k_heads)): more heads per program are masked off",
        ),
    ),
)
