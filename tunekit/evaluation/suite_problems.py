"""The suite's problems: the shapes each family is measured on, how they are built, and how a row is labelled."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from tunekit.core.space import Problem

Scope = Literal["full", "quick", "tiny"]

# ---------------------------------------------------------------------------------------------- shapes

HIDDEN_SIZES = (768, 1024, 2048, 4096, 12288, 16384, 25600)  # BERT/GPT-2 .. GPT-3 / large-model widths
ODD_SIZES = (4095, 4097, 8191, 8193)  # 2^k ± 1: no vector width divides the row
SMALL_ROWS = (1, 4, 16, 64)  # decode-time batches: launch-bound
SMALL_ROW_WIDTHS = (768, 4096, 16384, 25600)
HALF_DTYPES = ("float16", "bfloat16")
STREAM_ELEMENTS = 1 << 25  # large problems hold ~32Mi elements (64 MiB at 2 bytes): far past L2
MIN_LARGE_ROWS = 1024


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def large_rows(cols: int) -> int:
    """Rows of a bandwidth-sized problem of this width: a power of two (no row bucketing), at least 1024."""
    return max(MIN_LARGE_ROWS, _prev_pow2(STREAM_ELEMENTS // cols))


def _row_shapes(widths: Iterable[int]) -> list[tuple[int, int]]:
    return [(large_rows(n), n) for n in widths]


NORM_LARGE = _row_shapes(HIDDEN_SIZES + ODD_SIZES)
NORM_SMALL = [(m, n) for n in SMALL_ROW_WIDTHS for m in SMALL_ROWS]
NORM_QUICK = [(4096, 4096), (8, 4096)]
NORM_TINY = [(16, 256), (4, 1000)]
SOFTMAX_WIDTHS = (768, 1024, 4096, 4097, 8191, 16384, 32768, 50257)
REDUCTION_WIDTHS = (768, 4096, 4097, 16384)
GELU_FULL = ((1 << 27, "float32"), (1 << 26, "bfloat16"), (1 << 20, "float32"))  # 128Mi fp32 is the headline
GELU_QUICK = ((1 << 24, "float32"), (1 << 16, "float32"))
GELU_TINY = ((4096, "float32"),)

# LLM projections: (N, K) of attention and MLP layers (Llama-2 7B / Mistral 7B); weights [out, in] make B
# column-major, as nn.Linear's x @ W.T does.
LLM_M = (1, 16, 128, 2048, 8192, 16384)
LLM_NK = ((4096, 4096), (4096, 14336), (14336, 4096), (11008, 4096))
SQUARES = (1024, 2048, 4096, 8192)
ODD_GEMMS = ((3000, 3000, 3000), (4097, 4096, 4096), (1000, 1000, 1000), (2053, 2053, 2053))
# name -> (activation, bias, residual). GELU is the tanh form: cuBLASLt's GELU epilogue computes that one.
EPILOGUES: dict[str, tuple[str, bool, bool]] = {
    "none": ("none", False, False),
    "bias_relu": ("relu", True, False),
    "bias_gelu": ("gelu_tanh", True, False),
    "bias_gelu_residual": ("gelu_tanh", True, True),
}


def _short_dtype(dtype: object) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(str(dtype), str(dtype))


# ---------------------------------------------------------------------------------------------- norms


def _norm_problem(kernel: str, shape: tuple[int, int], dtype: str) -> Problem:
    from tunekit.core.registry import get_spec

    return get_spec(kernel).problem_from_shape(shape, dtype)


def norm_problems(kernel: str, shapes: Iterable[tuple[int, int]], dtypes: Iterable[str]) -> tuple[Problem, ...]:
    return tuple(_norm_problem(kernel, s, d) for d in dtypes for s in shapes)


def rows_label(problem: Problem) -> str:
    return f"{problem['rows']}x{problem['cols']} {_short_dtype(problem['dtype'])}"


# ---------------------------------------------------------------------------------------------- gelu


def gelu_problem(numel: int, dtype: str) -> Problem:
    from tunekit.kernels.pointwise.pointwise import pointwise_problem

    return pointwise_problem(numel, numel, dtype, "gelu_tanh", has_bias=False)


def gelu_label(problem: Problem) -> str:
    numel = int(problem["numel"])
    size = f"{numel >> 20}Mi" if numel >= 1 << 20 else str(numel)
    bias = f" +bias[{problem['cols']}]" if problem["has_bias"] else ""
    return f"{size}{bias} {_short_dtype(problem['dtype'])}"


# ---------------------------------------------------------------------------------------------- softmax, reduce


def softmax_problems(scope: Scope) -> tuple[Problem, ...]:
    from tunekit.kernels.row_softmax.softmax import problem

    shapes = {"full": _row_shapes(SOFTMAX_WIDTHS), "quick": [(4096, 4096)], "tiny": [(16, 256), (4, 1000)]}[scope]
    return tuple(problem(s, d) for d in HALF_DTYPES for s in shapes)


def reduction_problems(scope: Scope) -> tuple[Problem, ...]:
    from tunekit.kernels.reduction.reduction import problem

    # (op, dtype) pairs and row shapes per scope: the smaller scopes take fewer of each
    ops_dtypes, shapes = {
        "full": ([("sum", "float16"), ("sum", "bfloat16"), ("max", "bfloat16")], _row_shapes(REDUCTION_WIDTHS)),
        "quick": ([("sum", "bfloat16"), ("max", "bfloat16")], [(4096, 4096)]),
        "tiny": ([("sum", "float16"), ("max", "bfloat16")], [(16, 256)]),
    }[scope]
    return tuple(problem(op, "inner", s, d) for op, d in ops_dtypes for s in shapes)


def reduction_label(problem: Problem) -> str:
    return f"{problem['op']} {rows_label(problem)}"


# ---------------------------------------------------------------------------------------------- gemm


def gemm_problem(m: int, n: int, k: int, dtype: str, epilogue: str, b_layout: str = "row") -> Problem:
    from tunekit.kernels.gemm import make_problem

    activation, bias, residual = EPILOGUES[epilogue]
    return make_problem(m, n, k, dtype, b_layout=b_layout, activation=activation, has_bias=bias, has_residual=residual)


def epilogue_of(problem: Problem) -> str:
    wanted = (problem["activation"], problem["has_bias"], problem["has_residual"])
    return next((name for name, e in EPILOGUES.items() if e == wanted), str(problem["activation"]))


def gemm_label(problem: Problem) -> str:
    col = " Bᵀ" if problem["b_layout"] == "col" else ""
    shape = f"{problem['m']}x{problem['n']}x{problem['k']}"
    return f"{shape}{col} {epilogue_of(problem)} {_short_dtype(problem['dtype'])}"


def gemm_problems(shapes: Iterable[tuple[int, int, int, str]], dtype: str = "bfloat16") -> tuple[Problem, ...]:
    return tuple(gemm_problem(m, n, k, dtype, e, layout) for m, n, k, layout in shapes for e in EPILOGUES)


def gemm_from_shape(shape: tuple[int, ...], dtype: str) -> list[Problem]:
    from tunekit.core.registry import get_spec

    base = get_spec("gemm").problem_from_shape(shape, dtype)  # validates the shape and dtype
    m, n, k = int(base["m"]), int(base["n"]), int(base["k"])
    return [gemm_problem(m, n, k, dtype, e) for e in EPILOGUES]


GEMM_FULL_SHAPES = (
    [(m, n, k, "col") for n, k in LLM_NK for m in LLM_M]
    + [(s, s, s, "row") for s in SQUARES]
    + [(m, n, k, "row") for m, n, k in ODD_GEMMS]
)
