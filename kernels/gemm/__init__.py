"""GEMM with a fused epilogue: C = act(alpha * A @ B + bias) + beta * residual, fp32 accumulation.

A [M, K] and B [K, N] may each be row- or column-major (any strides work: they are kernel arguments); C is a
fresh row-major [M, N] of the input dtype. fp16/bf16 multiply on tensor cores with fp32 accumulation; fp32
inputs multiply as tf32. The epilogue (alpha, bias over N, activation, beta * residual) runs on the fp32
accumulator, once, before the single rounding to the output dtype.

Variants (see search_spaces/gemm/gemm.py): `grouped`, `persistent`, `splitk` (+ a reduce-and-epilogue kernel), `tma`
(Hopper tensor descriptors) and `staged` (the tma kernel on copies of A and B whose leading strides are padded to
16 bytes, for sizes that leave rows unaligned). The package:
- tiles.py: the @triton.jit building blocks every variant shares (tile order, alignment hints, K loop, epilogue);
- grouped.py, splitk.py, tma.py: the @triton.jit kernels, by variant family;
- host.py: the host launch: layouts, alignment, the staged copies, tensor descriptors, each variant's grid;
- problem.py: problems, inputs, the problem key of a launch, the heuristic and the references;
- perf_model.py: the tile geometry the quantization model reads;
- this module: the declaration.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported (the modules
# below import it).
import tunekit.core.backend  # noqa: F401

# isort: split

from tunekit.core.buckets import TokenBuckets
from tunekit.core.spec import Tolerance
from tunekit.kernels.common import op_kernel_spec
from tunekit.kernels.gemm.host import launch, layout_of, tensors_aligned16
from tunekit.kernels.gemm.perf_model import MODEL
from tunekit.kernels.gemm.problem import (
    alloc_outputs,
    bytes_moved,
    default_problems,
    epilogue_reference,
    flops,
    heuristic,
    key_of,
    make_inputs,
    make_problem,
    problem_from_shape,
    reference,
    torch_baseline,
    torch_gemm,
    torch_timing_inputs,
)
from tunekit.kernels.tolerances import ONE_ULP_UP_TO_4
from tunekit.search_spaces.gemm.gemm import ACTIVATIONS, LAYOUTS, SPACE, smem_bytes

SPEC = op_kernel_spec(
    __name__,
    name="gemm",
    description="C = act(alpha * A @ B + bias) + beta * residual; fp32 accumulation (tf32 for fp32 inputs), "
    "A and B row- or column-major",
    space=SPACE,
    problem_fields=(
        "m",
        "n",
        "k",
        "dtype",
        "a_layout",
        "b_layout",
        "activation",
        "has_bias",
        "has_residual",
        "aligned16",
    ),
    # Outputs are ~N(0, 1) (make_inputs scales B by 1/sqrt(K)). fp16/bf16: both sides round the same fp32-exact
    # products, so they differ by at most about one output ulp (near 2..4) plus summation order.
    # fp32 multiplies as tf32 (10-bit mantissa): ~1e-3 absolute error on N(0, 1) outputs.
    tolerances={"float32": Tolerance(atol=1e-2, rtol=1e-2), **ONE_ULP_UP_TO_4},
    version=1,
    shape_help="MxNxK, e.g. 4096x4096x4096 (A [M, K] @ B [K, N], both row-major)",
    model=MODEL,
    dependent_params=frozenset({"SPLIT_K", "GROUP_M"}),
    problem_values={"a_layout": LAYOUTS, "b_layout": LAYOUTS, "activation": ACTIVATIONS},
    # m counts tokens where A is row-major (a linear layer's forward and its dX = dY W); a column-major A is a
    # transposed activation (dW = X^T dY), whose m is a layer width: those problems keep their exact m.
    token_buckets=TokenBuckets("m", when={"a_layout": ("row",)}),
)

__all__ = [
    "ACTIVATIONS",
    "LAYOUTS",
    "SPEC",
    "alloc_outputs",
    "bytes_moved",
    "default_problems",
    "epilogue_reference",
    "flops",
    "heuristic",
    "key_of",
    "launch",
    "layout_of",
    "make_inputs",
    "make_problem",
    "problem_from_shape",
    "reference",
    "smem_bytes",
    "tensors_aligned16",
    "torch_baseline",
    "torch_gemm",
    "torch_timing_inputs",
]
