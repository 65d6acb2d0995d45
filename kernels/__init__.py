"""Triton kernels, installed as tunekit.kernels: one package per kernel family, one module per kernel, each
ending in its declaration (`SPEC = KernelSpec.of_module(...)`, or `op_kernel_spec`), which the registry
(tunekit/core/registry.py) names. A family's spaces sit in the same-named package under search_spaces/.

Families: gemm/ (the fused-epilogue GEMM), norms/ (LayerNorm, RMSNorm, forward and backward), row_softmax/ (softmax,
log-softmax, cross-entropy), reduction/ (sum, mean, max), pointwise/ (the fused elementwise chain, forward and
backward), rope/ (rotary embedding, forward and backward), glu/ (SwiGLU, forward). Each family package's docstring
lists its modules; a `perf_model.py` in it is the family's tile geometry for the quantization model
(tunekit/core/geometry.py). A kernel an op serves declares itself with common.op_kernel_spec (torch_fallback on).

Shared host and jit code, in one place each:
- common.py: the host helpers every kernel and space shares (powers of two, warps, element sizes, alignment, ...);
- tolerances.py: what the declarations' tolerances share (how far a rounded fp16/bf16 result may lie);
- persistent.py: the persistent-tiling host helpers of the backward kernels;
- row_window.py: the row kernels' aligned-window jit helpers (norms, softmax);
- rows_perf_model.py: the row kernels' tile geometry (norms, softmax, cross-entropy, pointwise backward).
"""
