"""tunekit.patch's speed against eager, for a before/after comparison of the patcher across two installs of tunekit
(one process each, alternated by the caller): per family at its 7B-class widths (2 decoder layers, bf16, random
weights), eager and the patched copy timed in alternation (median of per-round eager/patched ratios), out of the box.

    python tests/gpu/patch_speed.py --label after --families llama,mistral  # then the same under the other install

Prints one line per family and step; appends JSON lines to --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from contextlib import nullcontext
from pathlib import Path

import torch

import tunekit
from tunekit.evaluation.model_bench import build
from tunekit.evaluation.model_results import Workload
from tunekit.evaluation.step_timing import Alternation, default_timer
from tunekit.integrations.patching import patch

SIZES = {"prefill": (4, 1024), "decode": (8, 1), "train": (2, 1024)}
WIDTHS = {"llama": (4096, 32000), "mistral": (4096, 32000), "qwen2": (3584, 152064), "gemma": (2048, 256000)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--families", default="llama,mistral")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path("/tmp/patch_speed.jsonl"))
    opts = parser.parse_args()
    for family in opts.families.split(","):
        hidden, vocab = WIDTHS[family]
        base = build(Workload(family, hidden=hidden, vocab=vocab, **SIZES), torch.device("cuda"), torch.bfloat16)
        gen = torch.Generator(device="cpu").manual_seed(1)
        ids = {k: torch.randint(0, vocab, v, generator=gen).to("cuda") for k, v in SIZES.items()}
        patched = copy.deepcopy(base)
        patch(patched)
        timer = default_timer(base)
        for step in SIZES:
            calls = {}
            for name, model in (("eager", base), ("tunekit", patched)):
                model.train(step == "train")

                def call(model: torch.nn.Module = model, step: str = step, ids: dict = ids) -> None:
                    if step == "train":
                        model(ids[step], labels=ids[step], use_cache=False).loss.backward()
                        model.zero_grad(set_to_none=True)
                    else:
                        with torch.no_grad():
                            model(ids[step], use_cache=False)

                calls[name] = (call, nullcontext)
            times = Alternation(timer, opts.rounds, reps=5, warmup=3).run(calls)
            ratio = statistics.median(e / t for e, t in zip(times["eager"], times["tunekit"]))
            row = {"label": opts.label, "tunekit": tunekit.__file__, "family": family, "step": step, "vs_eager": ratio}
            with opts.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{opts.label:7} {family:8} {step:8} tunekit {ratio:.3f}x eager", flush=True)
        del base, patched
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
