"""Drop-in ops with torch's names and signatures, dispatching to the best cached config for each problem.

`sum` and `max` shadow the builtins inside this package, as `torch.sum` and `torch.max` do in torch's.
"""

from tunekit.ops.gemm import linear, matmul
from tunekit.ops.glu import swiglu
from tunekit.ops.norms import layer_norm, rms_norm
from tunekit.ops.pointwise import bias_act, bias_act_residual, gelu
from tunekit.ops.reduction import max, mean, sum
from tunekit.ops.rope import rotary_embedding
from tunekit.ops.row_softmax import cross_entropy, log_softmax, softmax
from tunekit.runtime import compile_policy

__all__ = [
    "bias_act",
    "bias_act_residual",
    "cross_entropy",
    "gelu",
    "layer_norm",
    "linear",
    "log_softmax",
    "matmul",
    "max",
    "mean",
    "rms_norm",
    "rotary_embedding",
    "softmax",
    "sum",
    "swiglu",
]

compile_policy.check_forced_names(__all__)
