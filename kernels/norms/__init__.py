"""The norms: LayerNorm and RMSNorm over the last dim, forward and backward, fp32 statistics.

- layernorm.py: the forward jit kernel of both norms (IS_RMS) and its launch, LayerNorm's declaration and
  `norm_spec`, through which all four norms declare themselves (their problem's fields and CLI shape);
- rmsnorm.py: RMSNorm's forward declaration (LayerNorm's space and traffic, its own jit body);
- layernorm_backward_jit.py: the backward jit kernels of both norms (IS_RMS), dweight and dbias as persistent
  partial sums (kernels/persistent.py adds them up);
- layernorm_backward.py: their launch and LayerNorm backward's declaration;
- rmsnorm_backward.py: RMSNorm backward's declaration on the same kernels.

Spaces: search_spaces/norms/ (RMSNorm's kernels search LayerNorm's spaces). Performance-model geometry: the row
kernels' shared kernels/rows_perf_model.py.
"""
