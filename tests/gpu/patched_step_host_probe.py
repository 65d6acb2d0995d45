"""Host cost of a patched model's eager decode step where every op call is torch's own (the default policy with
no entry serving a kernel: the screen sends each call to torch directly), against the unpatched model, in
alternation. Tiny models (64 wide, 2 layers), so that the step is all host time; runs on this CPU as well as on a
GPU (the kernels never run: each op's screen is set to match no problem).

    python tests/gpu/patched_step_host_probe.py [--model gpt2|llama] [--rounds 9] [--steps 200]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import transformers

from tunekit.core import backend
from tunekit.integrations.patching import patch
from tunekit.runtime import hotpath


def _model(family: str) -> torch.nn.Module:
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128))
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = backend.torch_device()
    own = _model(args.model).to(device).eval()
    patched = copy.deepcopy(own)
    patch(patched)
    for hot in hotpath.ops():  # no problem served a kernel: every call torch-direct
        hot.only_torch, hot.screened = False, frozenset()
    tokens = torch.randint(0, 128, (8, 1), device=device)

    def per_step_us(model: torch.nn.Module, steps: int) -> float:
        with torch.no_grad():
            start = time.perf_counter()
            for _ in range(steps):
                model(tokens, use_cache=False)
            if device.type == "cuda":
                torch.cuda.synchronize()
        return (time.perf_counter() - start) / steps * 1e6

    per_step_us(own, 50), per_step_us(patched, 50)
    rounds = [(per_step_us(own, args.steps), per_step_us(patched, args.steps)) for _ in range(args.rounds)]
    ratio = statistics.median(a / b for a, b in rounds)
    own_us, patched_us = (statistics.median(column) for column in zip(*rounds))
    print(f"{args.model}: eager {own_us:.0f} us, patched {patched_us:.0f} us a step; eager/patched {ratio:.3f}")


if __name__ == "__main__":
    main()
