"""Row softmax and what builds on it: softmax / log-softmax over the last dim (softmax.py) and the fused
cross-entropy loss with its gradient (cross_entropy.py, on softmax's single-block rows config).

Spaces: search_spaces/row_softmax/. Performance-model geometry: the row kernels' shared kernels/rows_perf_model.py.
"""
