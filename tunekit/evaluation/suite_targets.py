"""The suite's summary groups (named subsets of a family's rows) and the issue's targets over them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tunekit.core.space import Problem
from tunekit.evaluation.names import COPY_RATIO
from tunekit.evaluation.suite_problems import GELU_FULL, MIN_LARGE_ROWS

# A named subset of a family's problems that the summary reports a geomean over (e.g. widths 2^k±1).
Group = tuple[str, Callable[[Problem], bool]]

ALL = "all"
WIDTH_8 = "width multiple of 8"
WIDTH_ODD = "width 2^k±1"
GELU_HEADLINE = "128Mi fp32"
LONG_ROWS = "rows >= 1024"
GEMM_LARGE = "large aligned (M·N >= 2048², K >= 1024)"
GEMM_ODD = "odd sizes"
GEMM_SKINNY = "skinny M (1-128)"
GEMM_TILE = 128  # "aligned": every dimension a whole number of the usual tiles (the suite's odd sizes are not)


def is_pow2_plus_minus_1(n: int) -> bool:
    """2^k ± 1 (the suite's ODD_SIZES): odd, with a power of two next to it."""
    return n > 1 and n % 2 == 1 and ((n - 1) & (n - 2) == 0 or (n + 1) & n == 0)


def _width_8(problem: Problem) -> bool:
    return int(problem["cols"]) % 8 == 0


def _width_odd(problem: Problem) -> bool:
    return is_pow2_plus_minus_1(int(problem["cols"]))


def _gelu_headline(problem: Problem) -> bool:
    return int(problem["numel"]) == GELU_FULL[0][0] and problem["dtype"] == GELU_FULL[0][1]


def _long_rows(problem: Problem) -> bool:
    return int(problem["rows"]) >= MIN_LARGE_ROWS


def _gemm_skinny(problem: Problem) -> bool:
    return int(problem["m"]) <= 128


def _gemm_aligned(problem: Problem) -> bool:
    return all(int(problem[d]) % GEMM_TILE == 0 for d in ("m", "n", "k"))


def _gemm_large(problem: Problem) -> bool:
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    return not _gemm_skinny(problem) and _gemm_aligned(problem) and m * n >= 2048**2 and k >= 1024


def _gemm_odd(problem: Problem) -> bool:
    return not _gemm_skinny(problem) and not _gemm_aligned(problem)


NORM_GROUPS: tuple[Group, ...] = ((WIDTH_8, _width_8), (WIDTH_ODD, _width_odd))
GELU_GROUPS: tuple[Group, ...] = ((GELU_HEADLINE, _gelu_headline),)
LONG_ROW_GROUPS: tuple[Group, ...] = ((LONG_ROWS, _long_rows),)
GEMM_GROUPS: tuple[Group, ...] = ((GEMM_LARGE, _gemm_large), (GEMM_ODD, _gemm_odd), (GEMM_SKINNY, _gemm_skinny))


def vs(impl: str) -> str:
    """The name of tunekit's speedup over `impl` (tunekit.evaluation.report computes every ratio per row)."""
    return f"vs {impl}"


@dataclass(frozen=True)
class Target:
    """A target of the issue (H200, fp16 and bf16): the geomean of `ratio` over a family's `group` >= minimum."""

    family: str
    group: str
    ratio: str
    minimum: float


def _norm_forward_targets(family: str) -> tuple[Target, ...]:
    return (
        Target(family, WIDTH_8, COPY_RATIO, 0.90),
        Target(family, WIDTH_ODD, COPY_RATIO, 0.80),
        Target(family, ALL, vs("torch"), 2.0),
        Target(family, ALL, vs("torch.compile"), 1.3),
    )


TARGETS: tuple[Target, ...] = (
    *_norm_forward_targets("layernorm"),
    *_norm_forward_targets("rmsnorm"),
    Target("layernorm_backward", ALL, COPY_RATIO, 0.65),
    Target("layernorm_backward", ALL, vs("torch"), 1.5),
    Target("gelu", GELU_HEADLINE, COPY_RATIO, 0.90),
    Target("gelu", GELU_HEADLINE, vs("torch"), 8.0),
    Target("softmax", LONG_ROWS, COPY_RATIO, 0.85),
    Target("softmax", LONG_ROWS, vs("torch"), 1.5),
    Target("reduction", LONG_ROWS, COPY_RATIO, 0.85),
    Target("gemm", GEMM_LARGE, vs("cuBLASLt"), 1.0),
    Target("gemm", GEMM_ODD, vs("cuBLASLt"), 0.9),
    Target("gemm", GEMM_SKINNY, vs("cuBLASLt"), 0.9),
    Target("gemm", ALL, vs("torch"), 1.15),
)
