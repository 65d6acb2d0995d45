"""Rotary position embedding of q and k in one launch, and its exact adjoint.

- rope.py: the jit kernel (BACKWARD selects the adjoint), launch, transformers' formula and the declaration;
- rope_backward.py: the backward's declaration on the same kernel;
- perf_model.py: their tile geometry for the performance model.

Space: search_spaces/rope/.
"""
