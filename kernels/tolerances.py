"""What the kernels' tolerances share: how far a half-precision result may lie from the reference when both sides
round it to the output dtype. Each kernel's declaration (its SPEC) states its own fp32 tolerance and cites these.
"""

from __future__ import annotations

from tunekit.core.spec import Tolerance

# fp16/bf16 outputs up to ~4 in magnitude that both sides round to the output dtype: they may differ by one ulp,
# 2**-9 (fp16) or 2**-6 (bf16) near 2..4. The half-precision tolerances of the norms and the GEMM.
ONE_ULP_UP_TO_4 = {"float16": Tolerance(atol=1e-2, rtol=1e-2), "bfloat16": Tolerance(atol=2e-2, rtol=2e-2)}
# Two ulps of a result rounded once to fp16 or bf16 (one ulp is 2**-10 or 2**-7 of it): both sides round a value
# to the output dtype once; near a rounding boundary they may land one ulp apart, whatever the value's size.
ROUNDED_ONCE_RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def rounded_once(float32: Tolerance, float16_atol: float, bfloat16_atol: float) -> dict[str, Tolerance]:
    """The tolerances of a kernel whose fp16/bf16 results differ from the reference by one rounding of the result
    (ROUNDED_ONCE_RTOL), with each half type's `atol` for results near zero; `float32` is the kernel's own."""
    return {
        "float32": float32,
        "float16": Tolerance(atol=float16_atol, rtol=ROUNDED_ONCE_RTOL["float16"]),
        "bfloat16": Tolerance(atol=bfloat16_atol, rtol=ROUNDED_ONCE_RTOL["bfloat16"]),
    }
