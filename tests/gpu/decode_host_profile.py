"""Where a decode step's host time goes: cProfile of eager and tunekit-patched decode steps (8 sequences x 1 token,
the model benchmark's models), top functions by own time. Decode is bound by the host, so this is its cost.

    python tests/gpu/decode_host_profile.py [--model gpt2|llama] [--steps 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from tunekit.evaluation.model_bench import Workload, _variant, build


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--steps", type=int, default=200)
    opts = parser.parse_args()
    w = Workload(opts.model)
    base = build(w, torch.device("cuda"), torch.bfloat16).eval()
    ids = torch.randint(0, w.vocab, w.decode, device="cuda")
    for name in ("eager", "tunekit"):
        model, run = _variant(base, name, opts.model)
        model.eval()

        def step(run=run) -> None:
            with torch.no_grad():
                run(ids, use_cache=False)

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(opts.steps):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / opts.steps
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(opts.steps):
            step()
        torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
        print(f"\n=== {opts.model} decode {w.decode}, {name}: {wall_ms:.3f} ms per step (unprofiled) ===")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
