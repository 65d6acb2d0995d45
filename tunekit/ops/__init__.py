"""Drop-in ops with torch's names and signatures, dispatching to the best cached config for each problem."""

from tunekit.ops.normalization import layer_norm
from tunekit.ops.pointwise import bias_act, bias_act_residual, gelu

__all__ = ["bias_act", "bias_act_residual", "gelu", "layer_norm"]
