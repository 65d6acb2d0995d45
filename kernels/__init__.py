"""Triton kernels, installed as tunekit.kernels: one module (or package) per family, each ending in its declaration
(`SPEC = KernelSpec.of_module(...)`), which the registry (tunekit/registry.py) names.

- common.py: the host helpers every kernel and space shares (powers of two, warps, element sizes, alignment, ...);
- tolerances.py: what the declarations' tolerances share (how far a rounded fp16/bf16 result may lie);
- layernorm.py, rmsnorm.py, softmax.py: row forward kernels; row_window.py: their aligned-window jit helpers;
- layernorm_backward.py, rmsnorm_backward.py: the norm backwards (one set of jit kernels, IS_RMS); the four norms
  declare themselves through layernorm.norm_spec (their problem's fields and CLI shape);
- reduction.py, pointwise.py: sum/mean/max, and the fused elementwise chain;
- rope.py, rope_backward.py: rotary position embedding of q and k and its adjoint (one set of jit kernels, BACKWARD);
- gemm/: the fused-epilogue GEMM (jit kernels by variant family, host launch, problems, model, declaration);
- rows_perf_model.py, reduction_perf_model.py, pointwise_perf_model.py, rope_perf_model.py (and gemm/perf_model.py):
  each family's tile geometry for the quantization model (tunekit/geometry.py), declared as `KernelSpec.model`.
"""
