"""Search space of the RMSNorm forward kernel (kernels/rmsnorm.py): the LayerNorm forward's space.

RMSNorm's forward has LayerNorm's structure, one statistic fewer: the same three variants (`single` holds ROWS
whole rows in registers; `looped` walks one row in BLOCK_N chunks, twice; `window` is single through aligned
windows) with the same register, latency and shared-memory limits, so it uses search_spaces/layernorm.py's
parameters and rules unchanged. Its looped lanes carry one fp32 accumulator where LayerNorm's carry Welford's two,
so the looped register cap is conservative here.

The problem is a mapping with keys rows (a power-of-two bucket), cols, dtype, weight; the rules read rows, cols
and dtype only.
"""

from __future__ import annotations

from tunekit.search_spaces.layernorm import SPACE

__all__ = ["SPACE"]
