"""GEMM's space (gemm.py): tiles, stages, warps, variants, and the rules tying them to a problem."""
