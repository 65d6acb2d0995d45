"""A patched model's decode step captured in a CUDA graph and replayed on new tokens gives what the step gives
eagerly: the kernels tunekit serves (the hot path's replayed launches, on the capture stream) are capturable. Needs
a CUDA GPU (skipped without one; CI has none)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import tiny_llama

from tunekit.integrations.patching import patch
from tunekit.runtime import dispatch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs: needs a CUDA GPU"),
]


@pytest.mark.parametrize("untuned", ["torch", "triton"])
def test_a_patched_decode_step_replays_from_a_cuda_graph(untuned: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("TUNEKIT_UNTUNED", untuned)  # "triton": every untuned problem on tunekit's kernels
    dispatch.reset_all()
    torch.manual_seed(0)
    own = tiny_llama(2).to("cuda", torch.bfloat16).eval()
    patched = copy.deepcopy(own)
    assert patch(patched).swapped
    tokens = torch.randint(0, 128, (8, 1), device="cuda")

    def step() -> torch.Tensor:
        with torch.no_grad():
            return patched(tokens, use_cache=False).logits

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream: signatures seen, plans built
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    for seed in range(3):
        tokens.copy_(
            torch.randint(
                0, 128, tokens.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)
            )
        )
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            expected = own(tokens, use_cache=False).logits
        torch.testing.assert_close(logits, expected, rtol=2e-2, atol=2e-2)
    dispatch.reset_all()
