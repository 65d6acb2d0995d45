"""The benchmark suite as data: which problems each kernel family is measured on, against what torch code, and
what it has to reach.

A family names a kernel, the roofline it is held to (memory or compute), its problems at three sizes (`full`: the
issue's shapes for a GPU run; `quick`: a few of them for a smoke run on a GPU; `tiny`: the interpreter's) and the
torch a user would write instead (eager, which `evaluation.report` also hands to torch.compile), plus extra baselines
such as cuBLASLt's fused epilogues. Every baseline is built from the kernel's own `make_inputs`, so tunekit, torch
and the reference all see the same random data. Its groups are the subsets of its rows that the summary reports
apart, and `TARGETS` the issue's targets over them.

In order below: the shapes; per family its problems, row labels and torch programs; the summary groups and targets;
the families themselves, and `work_list`, the work a `tunekit bench` run picks from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import DTYPES, Inputs
from tunekit.evaluation.names import COPY_RATIO
from tunekit.evaluation.runners import Runner, TorchProgram

Scope = Literal["full", "quick", "tiny"]
Bound = Literal["memory", "compute"]

# Seed of every input the suite builds (the max-autotune child process rebuilds the same data from it).
SEED = 1234


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
GEMM_FULL_SHAPES = (
    [(m, n, k, "col") for n, k in LLM_NK for m in LLM_M]
    + [(s, s, s, "row") for s in SQUARES]
    + [(m, n, k, "row") for m, n, k in ODD_GEMMS]
)

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


def _layer_norm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def layernorm_program(inputs: Inputs) -> TorchProgram:
    x, w, b, eps = inputs
    return TorchProgram(_layer_norm, (x, w, b, eps))


def rmsnorm_program(inputs: Inputs) -> TorchProgram:
    x, w, eps = inputs
    return TorchProgram(_rms_norm, (x, w, eps))


def layernorm_backward_program(inputs: Inputs) -> TorchProgram:
    """The backward of F.layer_norm through autograd: torch's saved mean/rstd path, timed without its forward."""
    x, dy, w, want_dw, want_db, eps = inputs
    xr = x.detach().requires_grad_()
    wr = w.detach().requires_grad_(bool(want_dw)) if w is not None else None
    br = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device, requires_grad=True) if want_db else None
    leaves = (xr,) + ((wr,) if wr is not None and want_dw else ()) + ((br,) if br is not None else ())
    return TorchProgram(_layer_norm, (xr, wr, br, eps), grad=(dy, leaves))


# ---------------------------------------------------------------------------------------------- gelu


def gelu_problem(numel: int, dtype: str) -> Problem:
    from tunekit.kernels.pointwise.pointwise import pointwise_problem

    return pointwise_problem(numel, numel, dtype, "gelu_tanh", has_bias=False)


def gelu_label(problem: Problem) -> str:
    numel = int(problem["numel"])
    size = f"{numel >> 20}Mi" if numel >= 1 << 20 else str(numel)
    bias = f" +bias[{problem['cols']}]" if problem["has_bias"] else ""
    return f"{size}{bias} {_short_dtype(problem['dtype'])}"


def nine_op_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh-GELU the way it is written in model code: nine eager ops, each a kernel and a round trip to memory."""
    cube = x * x
    cube = cube * x
    inner = cube * 0.044715
    inner = x + inner
    inner = inner * math.sqrt(2.0 / math.pi)
    t = torch.tanh(inner)
    t = 1.0 + t
    half = 0.5 * x
    return half * t


def _gelu_chain(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    y = nine_op_gelu_tanh(x + bias if bias is not None else x)
    return y + residual if residual is not None else y


def _gelu_fused(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    y = F.gelu(x + bias if bias is not None else x, approximate="tanh")
    return y + residual if residual is not None else y


def unit_scale(inputs: Inputs) -> Inputs:
    """scale = 1: make_inputs uses 0.5 to catch a kernel ignoring it; model code has no scale op to pay for."""
    x, bias, residual, _, activation = inputs
    return (x, bias, residual, 1.0, activation)


def _gelu_args(inputs: Inputs) -> tuple[Any, ...]:
    x, bias, residual, _, activation = inputs
    if activation != "gelu_tanh":
        raise TunekitError(f"the gelu family's torch baselines compute gelu_tanh, not {activation!r}")
    return (x, bias, residual)


def gelu_program(inputs: Inputs) -> TorchProgram:
    return TorchProgram(_gelu_chain, _gelu_args(inputs))


def torch_fused_gelu(inputs: Inputs) -> Runner:
    args = _gelu_args(inputs)
    return lambda: _gelu_fused(*args)


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


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, -1)


def softmax_program(inputs: Inputs) -> TorchProgram:
    x, log = inputs
    return TorchProgram(_log_softmax if log else _softmax, (x,))


def _sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(1)


def _mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(1)


def _max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.max(x, 1)
    return values, indices


def reduction_program(inputs: Inputs) -> TorchProgram:
    x, op, _ = inputs  # dim 1 is the reduced one of [M, N] (inner) and of [B, M, N] (outer), as in the kernel
    return TorchProgram({"sum": _sum, "mean": _mean, "max": _max}[str(op)], (x,))


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


def _activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "none":
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    raise TunekitError(f"no torch baseline for the GEMM activation {activation!r}")


def _gemm_eager(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str
) -> torch.Tensor:
    y = a @ b
    if bias is not None:
        y = y + bias
    y = _activation(y, activation)
    return y + residual if residual is not None else y


def unit_alpha_beta(inputs: Inputs) -> Inputs:
    """alpha = beta = 1: make_inputs uses 0.75 / 0.5 to catch a kernel ignoring them; model code has neither."""
    a, b, bias, residual, activation, _, _ = inputs
    return (a, b, bias, residual, activation, 1.0, 1.0)


def gemm_program(inputs: Inputs) -> TorchProgram:
    a, b, bias, residual, activation, _, _ = inputs
    return TorchProgram(_gemm_eager, (a, b, bias, residual, activation))


def cublaslt_runner(inputs: Inputs) -> Runner | str:
    """cuBLASLt's fused bias + ReLU / GELU(tanh) epilogue through torch._addmm_activation, where one exists."""
    a, b, bias, residual, activation, _, _ = inputs
    if bias is None or residual is not None or activation not in ("relu", "gelu_tanh"):
        return "cuBLASLt has no fused epilogue for this (only bias+relu and bias+gelu)"
    use_gelu = activation == "gelu_tanh"
    return lambda: torch._addmm_activation(bias, a, b, use_gelu=use_gelu)


# ---------------------------------------------------------------------------------------------- groups, targets

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


# ---------------------------------------------------------------------------------------------- families


@dataclass(frozen=True)
class Baseline:
    """A named extra baseline: `build(inputs)` returns a runner, or a string saying why it does not apply."""

    name: str
    build: Callable[[Inputs], Runner | str]


def _same_inputs(inputs: Inputs) -> Inputs:
    return inputs


@dataclass(frozen=True)
class Family:
    name: str
    kernel: str
    bound: Bound
    full: tuple[Problem, ...]
    quick: tuple[Problem, ...]
    tiny: tuple[Problem, ...]
    torch_program: Callable[[Inputs], TorchProgram] | None
    label: Callable[[Problem], str]
    baselines: tuple[Baseline, ...] = ()
    # Applied to make_inputs' tuple before anything runs (e.g. GEMM's alpha = beta = 1: the plain user code).
    adapt_inputs: Callable[[Inputs], Inputs] = _same_inputs
    # Problems of one user-given shape (GEMM: one per epilogue); None: the kernel's problem_from_shape.
    from_shape: Callable[[tuple[int, ...], str], list[Problem]] | None = None
    note: str = ""
    # Subsets the summary also reports (every family also gets ALL, its whole set of rows).
    groups: tuple[Group, ...] = ()

    def problems(self, scope: Scope) -> list[Problem]:
        return list({"full": self.full, "quick": self.quick, "tiny": self.tiny}[scope])


def _norm_family(kernel: str, full: Any, program: Any, note: str = "") -> Family:
    """A normalization family: the same row shapes (hidden sizes, 2^k±1, small row counts) in fp16 and bf16."""
    return Family(
        kernel,
        kernel,
        "memory",
        full=norm_problems(kernel, full, HALF_DTYPES),
        quick=norm_problems(kernel, NORM_QUICK, HALF_DTYPES),
        tiny=norm_problems(kernel, NORM_TINY, HALF_DTYPES),
        torch_program=program,
        label=rows_label,
        note=note,
        groups=NORM_GROUPS,
    )


def _long_row_family(
    kernel: str,
    problems: Callable[[Scope], tuple[Problem, ...]],
    program: Callable[[Inputs], TorchProgram],
    label: Callable[[Problem], str],
) -> Family:
    """A row-wise family (softmax, reduction): its problems per scope, summarised over its bandwidth-sized rows."""
    return Family(
        kernel,
        kernel,
        "memory",
        full=problems("full"),
        quick=problems("quick"),
        tiny=problems("tiny"),
        torch_program=program,
        label=label,
        groups=LONG_ROW_GROUPS,
    )


def _build_families() -> dict[str, Family]:
    norm_full = NORM_LARGE + NORM_SMALL
    return {
        "layernorm": _norm_family("layernorm", norm_full, layernorm_program),
        "rmsnorm": _norm_family("rmsnorm", norm_full, rmsnorm_program),
        "layernorm_backward": _norm_family(
            "layernorm_backward",
            norm_full,
            layernorm_backward_program,
            note="bytes: x, dy, w read; dx, dw, db written (tunekit recomputes mean/rstd; torch also reads them)",
        ),
        "gelu": Family(
            "gelu",
            "pointwise",
            "memory",
            full=tuple(gelu_problem(n, d) for n, d in GELU_FULL),
            quick=tuple(gelu_problem(n, d) for n, d in GELU_QUICK),
            tiny=tuple(gelu_problem(n, d) for n, d in GELU_TINY),
            torch_program=gelu_program,
            label=gelu_label,
            baselines=(Baseline("torch F.gelu", torch_fused_gelu),),
            adapt_inputs=unit_scale,
            note="tanh-GELU: tunekit's one pass vs the nine-op eager chain (and torch's own fused F.gelu)",
            groups=GELU_GROUPS,
        ),
        "softmax": _long_row_family("softmax", softmax_problems, softmax_program, rows_label),
        "reduction": _long_row_family("reduction", reduction_problems, reduction_program, reduction_label),
        "gemm": Family(
            "gemm",
            "gemm",
            "compute",
            full=gemm_problems(GEMM_FULL_SHAPES),
            quick=gemm_problems([(4096, 4096, 4096, "row")]) + gemm_problems([(16, 4096, 4096, "col")])[:1],
            tiny=gemm_problems([(32, 32, 64, "row")]) + gemm_problems([(17, 33, 40, "col")])[1:2],
            torch_program=gemm_program,
            label=gemm_label,
            baselines=(Baseline("cuBLASLt", cublaslt_runner),),
            adapt_inputs=unit_alpha_beta,
            from_shape=gemm_from_shape,
            groups=GEMM_GROUPS,
        ),
    }


_FAMILIES: dict[str, Family] = {}

SUITES: dict[str, tuple[str, ...]] = {
    "memory": ("layernorm", "rmsnorm", "layernorm_backward", "gelu", "softmax", "reduction"),
    "gemm": ("gemm",),
}
SUITES["all"] = SUITES["memory"] + SUITES["gemm"]
# A kernel's name finds its family (the pointwise kernel's family is the GELU one).
_KERNEL_FAMILY = {"pointwise": "gelu"}


def families() -> dict[str, Family]:
    """Built on first use: building problems imports the kernel modules (and Triton)."""
    if not _FAMILIES:
        _FAMILIES.update(_build_families())
    return _FAMILIES


def _generic_family(kernel: str) -> Family:
    """A kernel without a suite entry: its default problems, its spec's torch_baseline, nothing compiled."""
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec

    spec = get_spec(kernel)
    defaults = tuple(spec.default_problems(fingerprint()))
    baselines: tuple[Baseline, ...] = ()
    if spec.torch_baseline is not None:
        baseline = spec.torch_baseline
        baselines = (Baseline("torch", lambda inputs: lambda: baseline(inputs)),)
    return Family(
        kernel,
        kernel,
        "memory",
        full=defaults,
        quick=defaults,
        tiny=defaults,
        torch_program=None,
        label=spec.describe_problem,
        baselines=baselines,
        note="not in the suite: the kernel's default problems and its spec's torch baseline",
    )


def family_for(kernel: str) -> Family:
    name = _KERNEL_FAMILY.get(kernel, kernel)
    found = families().get(name)
    return found if found is not None else _generic_family(kernel)


def work_list(
    kernel: str | None,
    suite: str | None,
    shapes: list[tuple[int, ...]],
    dtype: str | None,
    quick: bool,
    interpreted: bool,
) -> list[tuple[Family, Problem]]:
    """What `tunekit bench` measures: a kernel's family or a named suite, at full, quick or tiny size, or shapes.

    The interpreter always gets the tiny problems (the GPU sizes would take hours in Python).
    """
    if (kernel is None) == (suite is None):
        raise TunekitError("bench needs --kernel NAME or --suite NAME (one of them)")
    if suite is not None:
        if suite not in SUITES:
            raise TunekitError(f"unknown suite {suite!r}. Available: {sorted(SUITES)}")
        if shapes:
            raise TunekitError("--shape needs --kernel (a suite names its own shapes)")
        chosen = [families()[name] for name in SUITES[suite]]
    else:
        assert kernel is not None
        chosen = [family_for(kernel)]
    if shapes:
        (family,) = chosen
        return [(family, p) for shape in shapes for p in _from_shape(family, shape, dtype, interpreted)]
    scope: Scope = "tiny" if interpreted else "quick" if quick else "full"
    if dtype is not None and dtype not in DTYPES:
        raise TunekitError(f"--dtype must be one of {sorted(DTYPES)}, but got {dtype!r}")
    return [(f, p) for f in chosen for p in f.problems(scope) if dtype is None or p.get("dtype") == dtype]


def _from_shape(family: Family, shape: tuple[int, ...], dtype: str | None, interpreted: bool) -> list[Problem]:
    from tunekit.core.registry import get_spec

    chosen = dtype or ("float32" if interpreted else "bfloat16" if family.bound == "compute" else "float16")
    if family.from_shape is not None:
        return family.from_shape(shape, chosen)
    return [dict(get_spec(family.kernel).problem_from_shape(shape, chosen))]
