"""Reductions (sum, mean, max) over one dim of [outer, D, inner]: the inner and outer jit kernels
(reduction_jit.py), their launch and declaration (reduction.py), their tile geometry for the performance model
(perf_model.py).

Space: search_spaces/reduction/.
"""
