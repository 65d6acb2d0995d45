"""What the persistent backward kernels share on the host: the tiling pattern their heuristics follow, and the
torch baseline that times torch's backward alone (kernels/norms/layernorm_backward.py, rmsnorm_backward.py,
pointwise_backward.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tunekit.core.spec import Inputs
from tunekit.kernels.common import warps_for


@dataclass(frozen=True)
class PersistentTiling:
    """The sweep's pattern for a persistent backward grid (also the pointwise backward's heuristic)."""

    tile_bytes: int  # tiles of at least this many bytes
    thread_bytes: int  # bytes of a tile per thread
    warps_per_sm: int  # resident warps per SM, in programs of a tile each

    def tile_rows(self, width: int, element_size: int, most: int) -> int:
        """Rows per tile of `width` elements: enough for tile_bytes, at most `most` (a power of two) and 32."""
        return min(max(1, self.tile_bytes // element_size // width), most, 32)

    def warps(self, elements: int, element_size: int) -> int:
        return warps_for(elements, self.thread_bytes // element_size, 32)

    def programs_per_sm(self, warps: int) -> int:
        return max(1, self.warps_per_sm // warps)


# The baseline times torch's backward alone: its forward graph is built once per inputs and kept (one entry).
_BASELINE_GRAPH: dict[int, tuple[Inputs, torch.Tensor, list[torch.Tensor]]] = {}


def autograd_baseline(
    inputs: Inputs, forward: Callable[[Inputs], tuple[torch.Tensor, list[torch.Tensor]]]
) -> tuple[torch.Tensor, ...]:
    """The gradients of `forward(inputs)` = (y, leaves) for the upstream gradient inputs[1], by torch's autograd;
    the forward graph of the latest inputs is kept, so repeated calls time the backward alone."""
    cached = _BASELINE_GRAPH.get(id(inputs))
    if cached is None or cached[0] is not inputs:
        _BASELINE_GRAPH.clear()
        cached = _BASELINE_GRAPH[id(inputs)] = (inputs, *forward(inputs))
    _, y, leaves = cached
    return torch.autograd.grad(y, leaves, inputs[1], retain_graph=True)
