"""A small model built from tunekit.ops traces under torch.compile(fullgraph=True): no graph breaks."""

from __future__ import annotations

import pytest
import torch
from helpers import mlp_parameters

import tunekit.ops as tk


class Block(torch.nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        g, self.w1, self.b1, self.w2 = mlp_parameters(d, hidden)
        self.ln_w = torch.nn.Parameter(1 + 0.1 * torch.randn(d, generator=g))
        self.ln_b = torch.nn.Parameter(0.1 * torch.randn(d, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = tk.layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b)
        h = tk.linear(h, self.w1, self.b1, activation="gelu_tanh")
        h = tk.linear(h, self.w2, residual=x)
        scores = tk.softmax(h, dim=-1)
        return tk.sum(scores * h, dim=-1) + tk.mean(h, dim=-1)


def reference(block: Block, x: torch.Tensor) -> torch.Tensor:
    f = torch.nn.functional
    h = f.layer_norm(x, (x.shape[-1],), block.ln_w, block.ln_b)
    h = f.gelu(h @ block.w1.T + block.b1, approximate="tanh")
    h = h @ block.w2.T + x
    return (torch.softmax(h, dim=-1) * h).sum(-1) + h.mean(-1)


@pytest.mark.usefixtures("swapped_under_compile")
def test_model_compiles_fullgraph_and_matches_eager():
    block = Block(d=32, hidden=48)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True, backend="eager")(x)
        want = reference(block, x)
    torch.testing.assert_close(eager, want, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
