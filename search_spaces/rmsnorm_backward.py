"""Search space of the RMSNorm backward kernel (kernels/rmsnorm_backward.py): the LayerNorm backward's space.

RMSNorm's backward runs the LayerNorm backward kernels with IS_RMS set (no mean, no dbias), so it shares their
parameters and rules (search_spaces/layernorm_backward.py), which read rows, cols and dtype only.
"""

from __future__ import annotations

from tunekit.search_spaces.layernorm_backward import SPACE

__all__ = ["SPACE"]
