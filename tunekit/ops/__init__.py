"""Drop-in ops with torch's names and signatures, dispatching to the best cached config for each problem."""

from tunekit.ops.normalization import layer_norm

__all__ = ["layer_norm"]
