"""Which tunekit ops a torch.compile graph calls as tunekit's own; every other op traces as its torch equivalent.

Inductor generates its own fused kernels for norms, RoPE, activations and residual adds, and picks GEMM kernels
itself. An opaque op in the middle of such a chain stops that fusion and puts a host dispatch into every call of
the compiled graph: patched models under compile ran at 0.64-0.79x eager for decode and 0.86-0.90x for training
(Qwen2- and Mistral-family models on the H200), where compile alone gave 2.6x and 1.2-1.3x. So under compile an op
is swapped only where it is measured to beat what Inductor generates for the same region
(tests/gpu/compile_transfer.py times each choice in the model, compile alone in the same run); by default that is
the set below. TUNEKIT_COMPILE_OPS overrides it: a comma list of op names, `all` or `none`.

The set is read when this module is imported: a compiled graph treats it as a constant, so changing it means
compiling again (torch._dynamo.reset()).
"""

from __future__ import annotations

import torch

from tunekit.core import settings
from tunekit.core.errors import TunekitError

# Measured to win inside a compiled model (tests/gpu/compile_transfer.py, H200): see RESULTS.md.
DEFAULT: frozenset[str] = frozenset()
OPS = (
    "layer_norm", "rms_norm", "linear", "matmul", "softmax", "log_softmax", "sum", "mean", "max", "gelu", "bias_act",
    "bias_act_residual", "rotary_embedding", "cross_entropy",
)  # fmt: skip


def _from_settings() -> frozenset[str]:
    raw = settings.compile_ops()
    if raw is None:
        return DEFAULT
    if raw == "all":
        return frozenset(OPS)
    if raw == "none":
        return frozenset()
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - set(OPS))
    if unknown:
        raise TunekitError(f"TUNEKIT_COMPILE_OPS must name ops of {', '.join(OPS)} (or all, none), but got {unknown}")
    return names


SWAPPED: frozenset[str] = _from_settings()


def swapped_under_compile(op_name: str) -> bool:
    return op_name in SWAPPED


def traces_as_model_code(op_name: str) -> bool:
    """Being compiled, and `op_name` not swapped: a patched module (or RoPE function) then runs the model's own code,
    so the compiled graph is the one compile alone would build."""
    return torch.compiler.is_compiling() and op_name not in SWAPPED
