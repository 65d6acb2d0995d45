"""tunekit's tuned GEMM tiles as Inductor's choices (tunekit.integrations.inductor_choices) against max-autotune and
the default mode: compile time and step time.

A pack model (2 decoder layers, bf16, random weights) per step (prefill, decode, train), compiled several ways on
copies of the same weights: torch.compile's default mode, twice (the second, "compile (control)", is the noise
of a ratio); mode="max-autotune-no-cudagraphs" (Inductor searches its GEMM templates against cuBLAS); and the
default mode with `tuned_gemm_choices`' options, untuned GEMMs given torch's GEMM only ("tunekit tiles") or
Inductor's own search ("tunekit tiles + search"). Opt-in: "reduce-overhead" and "tunekit tiles + search
(reduce-overhead)", the same with CUDA graphs.
On a GPU the pack's shipped entries are the store. Inductor's caches are off, so each first call is a cold
compile; each (variant, step) is its own compiled copy with static shapes. Then every step's variants are timed
in alternation (median of per-round ratios vs the default mode), and prefill's logits compared with eager's.

    python tests/gpu/inductor_choices_bench.py --model qwen2.5-7b [--steps prefill,decode,train] [--rounds 5]

Prints a table last; JSON under $OUT. `--shrink K` with TRITON_INTERPRET=1 runs it on a CPU (a dry run: Inductor's
CPU code, no Triton templates there, so every variant lowers GEMMs to torch's).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from model_packs import DEVICE, shrink_widths, steps_for

from tunekit.evaluation.model_packs import PACK_MODELS, build_pack_model
from tunekit.evaluation.step_timing import Alternation, default_timer
from tunekit.integrations.inductor_choices import tuned_gemm_choices

OUT = Path(os.environ.get("OUT", "/tmp/out"))
VARIANTS = ("compile", "compile (control)", "max-autotune", "tunekit tiles", "tunekit tiles + search")
# opt-in (--variants): compile's reduce-overhead mode (CUDA graphs), alone and with tunekit's choices
CUDA_GRAPH_VARIANTS = ("reduce-overhead", "tunekit tiles + search (reduce-overhead)")

UNTUNED = {"tunekit tiles": "aten", "tunekit tiles + search": "inductor"}
UNTUNED["tunekit tiles + search (reduce-overhead)"] = "inductor"


def compile_context(variant: str) -> AbstractContextManager[Any]:
    return tuned_gemm_choices(UNTUNED[variant]) if variant in UNTUNED else nullcontext()


def compiled(base: torch.nn.Module, variant: str, choices: Any) -> torch.nn.Module:
    """A compiled copy. Distinct options per variant: torch.compile calls with equal options share Dynamo's
    cache entries across copies of one model class (a copy would run another variant's code)."""
    model = copy.deepcopy(base)
    if variant in ("max-autotune", "reduce-overhead"):
        return torch.compile(model, mode="max-autotune-no-cudagraphs" if variant == "max-autotune" else variant)
    options = dict(choices.compile_options) if choices is not None else {}
    if variant == "compile (control)":  # the default mode again, its own cache entries: the noise of a ratio
        options = {"max_autotune_gemm": False}
    if variant.endswith("(reduce-overhead)"):
        options["triton.cudagraphs"] = True  # what mode="reduce-overhead" sets (mode and options exclude each other)
    return torch.compile(model, options=options or None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-7b", choices=sorted(PACK_MODELS))
    parser.add_argument("--steps", default="prefill,decode,train")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shrink", type=int, default=1)
    opts = parser.parse_args()
    if opts.shrink > 1:
        shrink_widths(opts.shrink)
    OUT.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 64  # one compiled copy per (variant, step): no eager fallback
    torch._dynamo.config.accumulated_cache_size_limit = 512
    torch._dynamo.config.automatic_dynamic_shapes = False  # each step compiles for its own static shapes
    torch._inductor.config.fx_graph_cache = False  # cold compiles, so compile times compare
    torch._inductor.config.autotune_local_cache = False
    variants = opts.variants.split(",")
    base = build_pack_model(opts.model, DEVICE, layers=2)
    step_fns = steps_for(PACK_MODELS[opts.model].widths["vocab_size"])
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    result: dict[str, Any] = {"model": opts.model, "device": device}
    for step_name in opts.steps.split(","):
        step, train = step_fns[step_name], step_name == "train"
        models: dict[str, torch.nn.Module] = {"eager": base}
        compile_s: dict[str, float] = {}
        decisions: dict[str, dict[str, int]] = {}
        untuned: dict[str, list[str]] = {}  # the GEMMs no entry served: what a pack or a tune would add
        for variant in variants:
            with compile_context(variant) as choices:
                model = compiled(base, variant, choices)
                model.train(train)
                t0 = time.perf_counter()
                step(model)
                torch.cuda.synchronize() if DEVICE == "cuda" else None
                compile_s[variant] = round(time.perf_counter() - t0, 1)
            if choices is not None:
                decisions[variant] = dict(Counter(d for _, d, _ in choices.decisions))
                untuned[variant] = [f"{op} {dict(p)}" for op, d, p in choices.decisions if d == "untuned"]
            model.zero_grad(set_to_none=True)
            models[variant] = model
            print(f"{step_name} {variant}: first call {compile_s[variant]} s {decisions.get(variant, '')}", flush=True)
        logits_diff = {}
        if step_name == "prefill":
            ids = torch.randint(0, PACK_MODELS[opts.model].widths["vocab_size"], (4, 1024)).to(DEVICE)
            with torch.no_grad():
                want = base(ids, use_cache=False).logits.float()
                for variant in variants:
                    got = models[variant](ids, use_cache=False).logits.float()
                    logits_diff[variant] = float((got - want).abs().max())
        calls = {}
        for variant, model in models.items():
            model.train(train)

            def call(model=model, step=step) -> None:
                step(model)
                model.zero_grad(set_to_none=True)

            calls[variant] = (call, nullcontext)
        times = Alternation(default_timer(base), opts.rounds, reps=5, warmup=3).run(calls)
        row = {
            variant: {
                "ms": statistics.median(times[variant]),
                "vs_compile": statistics.median(c / t for c, t in zip(times["compile"], times[variant])),
                "vs_eager": statistics.median(e / t for e, t in zip(times["eager"], times[variant])),
                "compile_s": compile_s.get(variant),
                "decisions": decisions.get(variant),
                "untuned": untuned.get(variant),
                "logits_max_diff": logits_diff.get(variant),
            }
            for variant in models
        }
        result[step_name] = row
        (OUT / f"inductor_choices_{opts.model}.json").write_text(json.dumps(result, indent=1))
    print(f"\n{opts.model} on {result['device']}: speed vs compile's default mode (per-round median), first call s")
    print(f"{'step':8} {'variant':24} {'ms':>9} {'vs compile':>11} {'vs eager':>9} {'1st call s':>11}")
    for step_name in opts.steps.split(","):
        for variant, r in result[step_name].items():
            first = "" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
            print(f"{step_name:8} {variant:24} {r['ms']:9.3f} {r['vs_compile']:11.3f} {r['vs_eager']:9.3f} {first:>11}")


if __name__ == "__main__":
    main()
