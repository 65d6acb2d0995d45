"""The fused elementwise chain act(x + bias) (+ residual) and its backward.

- pointwise.py: the forward jit kernel, launch and declaration;
- pointwise_backward.py: the backward (dx, and dbias as persistent partial sums);
- perf_model.py: their tile geometry for the performance model.

Spaces: search_spaces/pointwise/.
"""
