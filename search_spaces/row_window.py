"""When the row kernels' `window` variant applies and how wide its block is (kernels/row_window.py).

Shared by the spaces of LayerNorm, RMSNorm and softmax: a row that is no whole number of 16-byte vectors makes
most rows start inside one, and the window variant reads them through the aligned vectors that contain them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunekit.space import Config, Problem, Rule
from tunekit.spec import DTYPES

if TYPE_CHECKING:
    from tunekit.device import DeviceFingerprint

VECTOR_BYTES = 16  # the widest global load a thread issues


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def vector_elements(dtype: str) -> int:
    """Elements per 16-byte vector."""
    return max(1, VECTOR_BYTES // DTYPES[dtype].itemsize)


def window_block_n(cols: int, dtype: str) -> int:
    """The block a window program needs: the row plus up to one vector of lead-in (16 is the spaces' smallest)."""
    return max(16, _next_pow2(cols + vector_elements(dtype) - 1))


def rows_unaligned(problem: Problem) -> bool:
    """Rows are not a whole number of 16-byte vectors, so most rows start inside one."""
    return int(problem["cols"]) * DTYPES[str(problem["dtype"])].itemsize % VECTOR_BYTES != 0


def _window_for_unaligned_rows(config: Config, problem: Problem, device: DeviceFingerprint) -> bool:
    return config["variant"] != "window" or rows_unaligned(problem)


WINDOW_ONLY_FOR_UNALIGNED_ROWS = Rule(
    "window_only_for_unaligned_rows",
    _window_for_unaligned_rows,
    why="rows of whole 16-byte vectors start on one: window would be single with a wider block",
)
