"""The norms' spaces: layernorm.py (the forward, RMSNorm's too) and layernorm_backward.py (both backwards)."""
