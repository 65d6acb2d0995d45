"""The fused elementwise chain act(x + bias) (+ residual) and its backward.

- pointwise.py: the forward jit kernel, launch and declaration;
- pointwise_backward_jit.py: the backward jit kernel (dx, and dbias as persistent partial sums);
- pointwise_backward.py: its launch and declaration;
- perf_model.py: their tile geometry for the performance model.

Spaces: search_spaces/pointwise/.
"""
