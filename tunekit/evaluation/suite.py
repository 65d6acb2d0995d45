"""The benchmark suite as data: which problems each kernel family is measured on, and against what torch code.

A family names a kernel, the roofline it is held to (memory or compute), its problems at three sizes (`full`: the
issue's shapes for a GPU run; `quick`: a few of them for a smoke run on a GPU; `tiny`: the interpreter's) and the
torch a user would write instead (eager, which `evaluation.report` also hands to torch.compile), plus extra baselines
such as cuBLASLt's fused epilogues. Every baseline is built from the kernel's own `make_inputs`, so tunekit, torch
and the reference all see the same random data.

This module puts the families together and picks a run's work; their parts live beside it: `suite_problems` (the
shapes and row labels), `suite_baselines` (the torch programs and runners), `suite_targets` (summary groups and the
issue's targets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import DTYPES, Inputs
from tunekit.evaluation.suite_baselines import (
    AutogradRunner,
    Baseline,
    TorchProgram,
    cublaslt_runner,
    eager_runner,
    gelu_program,
    gemm_program,
    layernorm_backward_program,
    layernorm_program,
    nine_op_gelu_tanh,
    reduction_program,
    rmsnorm_program,
    softmax_program,
    torch_fused_gelu,
    unit_alpha_beta,
    unit_scale,
)
from tunekit.evaluation.suite_problems import (
    EPILOGUES,
    GELU_FULL,
    GELU_QUICK,
    GELU_TINY,
    GEMM_FULL_SHAPES,
    HALF_DTYPES,
    HIDDEN_SIZES,
    NORM_LARGE,
    NORM_QUICK,
    NORM_SMALL,
    NORM_TINY,
    ODD_GEMMS,
    ODD_SIZES,
    SMALL_ROW_WIDTHS,
    Scope,
    epilogue_of,
    gelu_label,
    gelu_problem,
    gemm_from_shape,
    gemm_label,
    gemm_problem,
    gemm_problems,
    norm_problems,
    reduction_label,
    reduction_problems,
    rows_label,
    softmax_problems,
)
from tunekit.evaluation.suite_targets import (
    ALL,
    GELU_GROUPS,
    GEMM_GROUPS,
    GEMM_LARGE,
    GEMM_ODD,
    GEMM_SKINNY,
    LONG_ROW_GROUPS,
    NORM_GROUPS,
    TARGETS,
    WIDTH_8,
    WIDTH_ODD,
    Group,
    Target,
    is_pow2_plus_minus_1,
)

# The suite's names as tests and tools (tests/gpu) read them, wherever among its parts they are defined.
__all__ = [
    "ALL",
    "EPILOGUES",
    "GEMM_GROUPS",
    "GEMM_LARGE",
    "GEMM_ODD",
    "GEMM_SKINNY",
    "HIDDEN_SIZES",
    "ODD_GEMMS",
    "ODD_SIZES",
    "SEED",
    "SMALL_ROW_WIDTHS",
    "SUITES",
    "TARGETS",
    "WIDTH_8",
    "WIDTH_ODD",
    "AutogradRunner",
    "Baseline",
    "Family",
    "Target",
    "cublaslt_runner",
    "eager_runner",
    "epilogue_of",
    "families",
    "family_for",
    "gemm_problem",
    "gemm_program",
    "is_pow2_plus_minus_1",
    "nine_op_gelu_tanh",
    "work_list",
]

Bound = Literal["memory", "compute"]

# Seed of every input the suite builds (the max-autotune child process rebuilds the same data from it).
SEED = 1234


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
