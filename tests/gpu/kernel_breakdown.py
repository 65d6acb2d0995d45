"""Where a model's GPU time goes, by kernel kind: eager against tunekit-patched (and Liger where it patches the
model), for prefill and a training step. It shows what a per-module patch can reach: the time left in kernels that
no module owns (RoPE, residual adds, the gate product, casts) bounds the speedup of swapping modules.

    python tests/gpu/kernel_breakdown.py [--model llama|gpt2] [--out DIR]

Prints one table per run (kind: GPU ms per step, eager vs patched); JSON under --out.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from tunekit.evaluation.model_bench import Workload, _variant, build
from tunekit.evaluation.step_profile import profile_kinds


def profile(fn) -> dict[str, float]:
    return {k: v for k, v in profile_kinds(fn).items() if not k.startswith("calls ")}


def _profile_variant(base, name: str, model_kind: str, ids: torch.Tensor) -> tuple[dict, dict]:
    model, run = _variant(base, name, model_kind)

    def prefill() -> None:
        with torch.no_grad():
            run(ids, use_cache=False)

    def train() -> None:
        model.zero_grad(set_to_none=True)
        run(ids, labels=ids, use_cache=False).loss.backward()

    model.eval()
    forward = profile(prefill)
    model.train()
    return forward, profile(train)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    w = Workload(opts.model)
    base = build(w, torch.device("cuda"), torch.bfloat16)
    variants = ["eager", "tunekit"] + (["liger"] if opts.model == "llama" else [])
    ids = torch.randint(0, w.vocab, w.prefill, device="cuda")
    record: dict[str, dict[str, dict[str, float]]] = {}
    for name in variants:
        prefill, train = _profile_variant(base, name, opts.model, ids)
        record.setdefault("prefill", {})[name] = prefill
        record.setdefault("train", {})[name] = train
        torch.cuda.empty_cache()
    (opts.out / f"kernel_breakdown_{opts.model}.json").write_text(json.dumps(record, indent=1))
    for run_name, by_variant in record.items():
        kinds = sorted(
            {k for v in by_variant.values() for k in v if not k.startswith(" ")},
            key=lambda k: -by_variant["eager"].get(k, 0),
        )
        named = sorted(
            (k for k in by_variant["tunekit"] if k.startswith(" ")), key=lambda k: -by_variant["tunekit"][k]
        )[:14]
        print(f"\n{opts.model} {run_name} {w.prefill}: GPU ms per step by kernel kind")
        print(f"{'kind':14}" + "".join(f"{v:>10}" for v in by_variant))
        for kind in [*kinds, "total"]:
            cells = [
                sum(t for k, t in v.items() if not k.startswith(" ")) if kind == "total" else v.get(kind, 0.0)
                for v in by_variant.values()
            ]
            print(f"{kind:14}" + "".join(f"{c:10.3f}" for c in cells))
        print("tunekit's largest kernels outside GEMM and attention (ms per step):")
        for k in named:
            print(f"{by_variant['tunekit'][k]:8.3f} {k.strip()}")


if __name__ == "__main__":
    main()
