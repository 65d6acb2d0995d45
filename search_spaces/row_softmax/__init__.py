"""Row softmax's space (softmax.py) and cross-entropy's (cross_entropy.py), on the row kernels' rows.py."""
