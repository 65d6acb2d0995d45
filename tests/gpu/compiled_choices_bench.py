"""tunekit under torch.compile with the GEMM choices decided in the compiled step (tunekit.runtime.compiled_gemm,
tunekit.evaluation.compiled_step) against compile's default mode, max-autotune and reduce-overhead.

A model (2 decoder layers, bf16, random weights): a family at its 7B widths (model_transfer.py's, not a pack's
model) or a pack's model. Per step, each variant is its own compiled copy with static shapes and cold Inductor
caches, so first-call times compare:
  eager; compile (default mode); compile (control: the default mode again, the noise of a ratio);
  max-autotune (mode="max-autotune-no-cudagraphs"); reduce-overhead (decode only);
  tunekit (out of the box): tunekit.patch, then the default mode, with what the store holds (a pack's verdicts);
then `decide_compiled` on a patched copy (Inductor's search per GEMM, decided in the compiled step, stored; with
  --tune-budget, `tune_model(..., compiled=True)`: the step's problems tuned eagerly first, so each has an entry), and
  tunekit (tuned): a new patched copy compiled in the default mode, the verdicts served from the store.
Each phase's variants are timed in alternation (median of per-round ratios vs compile's default mode).

    python tests/gpu/compiled_choices_bench.py --model llama --steps decode,prefill [--rounds 5] [--tune-budget 60]

Prints the table last; JSON under $OUT.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from model_transfer import SIZES, WIDTHS, held_out, steps

from tunekit.evaluation.compiled_step import decide_compiled
from tunekit.evaluation.step_timing import Alternation, default_timer
from tunekit.evaluation.tune_model import tune_model
from tunekit.integrations import inductor_outer_products
from tunekit.integrations.patching import patch

OUT = Path(os.environ.get("OUT", "/tmp/out"))
# Distinct (default-valued) options per compiled variant: equal options would share Dynamo's cache entries
# across copies of one model class.
OPTIONS = {
    "compile": None,
    "compile (control)": {"max_autotune_gemm": False},
    "tunekit (out of the box)": {"epilogue_fusion": True},
    "tunekit (tuned)": {"pattern_matcher": True},
    # Inductor's own GEMM search over its Triton templates alone (no cuBLAS candidate): `--extra`
    "gemm-autotune-triton": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON"},
}


def build(name: str) -> tuple[torch.nn.Module, dict[str, Any], int]:
    if name in WIDTHS:
        base, ids = held_out(name)
        return base, steps(ids), WIDTHS[name][1]
    from model_packs import steps_for

    from tunekit.evaluation.model_packs import PACK_MODELS, build_pack_model

    vocab = PACK_MODELS[name].widths["vocab_size"]
    return build_pack_model(name, "cuda", layers=2), steps_for(vocab), vocab


def compiled(base: torch.nn.Module, variant: str) -> torch.nn.Module:
    model = copy.deepcopy(base)
    if variant.startswith("tunekit"):
        patch(model)
    if variant == "max-autotune":
        return torch.compile(model, mode="max-autotune-no-cudagraphs")
    if variant == "reduce-overhead":
        return torch.compile(model, mode="reduce-overhead")
    return torch.compile(model, options=OPTIONS[variant])


def kernels_per_step(model: torch.nn.Module, step: Any, calls: int = 3) -> float:
    """CUDA kernels one step launches (the profiler's device events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step(model)
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()) / calls


def first_call(model: torch.nn.Module, step: Any, own_graph: bool = False) -> float:
    """The first call's seconds (the compile); `own_graph`: compiled without tunekit's Inductor pass (compile alone
    and Inductor's modes, in a process where a model was patched)."""
    with inductor_outer_products.disabled() if own_graph else nullcontext():
        t0 = time.perf_counter()
        step(model)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0


def alternate(models: dict[str, torch.nn.Module], step: Any, rounds: int) -> dict[str, dict[str, float]]:
    calls = {}
    for variant, model in models.items():

        def call(model: torch.nn.Module = model) -> None:
            step(model)
            model.zero_grad(set_to_none=True)

        calls[variant] = (call, nullcontext)
    times = Alternation(default_timer(next(iter(models.values()))), rounds, reps=5, warmup=3).run(calls)
    return {
        v: {
            "ms": statistics.median(times[v]),
            "vs_compile": statistics.median(c / t for c, t in zip(times["compile"], times[v])),
            "vs_eager": statistics.median(e / t for e, t in zip(times["eager"], times[v])) if "eager" in times else 0,
        }
        for v in models
    }


def logits_diff(base: torch.nn.Module, model: torch.nn.Module, vocab: int) -> float:
    ids = torch.randint(0, vocab, SIZES["prefill"], generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        return float(
            (model(ids, use_cache=False).logits.float() - base(ids, use_cache=False).logits.float()).abs().max()
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--steps", default="decode,prefill")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-autotune-steps", default="decode,prefill", help="steps timed with max-autotune too")
    parser.add_argument("--tune-budget", type=float, default=0.0,
                        help="seconds: tune_model(compiled=True) on the step (eager tune, then the compiled verdicts); "
                        "0: decide_compiled alone (stores verdicts only for problems with entries); "
                        "-1: no tuned phase")  # fmt: skip
    parser.add_argument("--extra", default="", help="more compiled variants, timed before and after (OPTIONS' names)")
    opts = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 1024
    torch._dynamo.config.automatic_dynamic_shapes = False  # each step compiles for its own static shapes
    torch._inductor.config.force_disable_caches = True  # cold compiles: first calls compare
    base, step_fns, vocab = build(opts.model)
    names = opts.steps.split(",")
    result: dict[str, Any] = {"model": opts.model, "device": torch.cuda.get_device_name(), "steps": {}}
    for name in names:
        step, train = step_fns[name], name == "train"
        base.train(train)
        variants = ["compile", "compile (control)", "tunekit (out of the box)"]
        if name in opts.max_autotune_steps.split(","):
            variants.append("max-autotune")
        if name == "decode":
            variants.append("reduce-overhead")
        extra = [v for v in opts.extra.split(",") if v]
        variants += extra
        models: dict[str, torch.nn.Module] = {"eager": base}
        first: dict[str, float] = {}
        for variant in variants:
            models[variant] = compiled(base, variant)
            models[variant].train(train)
            first[variant] = first_call(models[variant], step, own_graph=not variant.startswith("tunekit"))
            print(f"{name} {variant}: first call {first[variant]:.1f} s", flush=True)
        before = alternate(models, step, opts.rounds)

        if opts.tune_budget < 0:  # out of the box only (what the store and the packs hold)
            result["steps"][name] = {"before": before, "first_call_s": first}
            (OUT / f"compiled_choices_{opts.model}.json").write_text(json.dumps(result, indent=1, default=str))
            continue
        tuned_model = copy.deepcopy(base)
        patch(tuned_model)
        t0 = time.perf_counter()
        if opts.tune_budget > 0:  # the user's path: tune the step's problems eagerly, then decide under compile
            tuned_report = tune_model(tuned_model, {name: step}, budget_s=opts.tune_budget, compare_eager=False,
                                      compiled=True, rounds=opts.rounds)  # fmt: skip
            print(tuned_report.table(), flush=True)
            assert tuned_report.compiled is not None
            report = tuned_report.compiled
        else:
            report = decide_compiled(tuned_model, {name: step})
        decide_s = time.perf_counter() - t0
        print(report.table(), flush=True)
        del tuned_model
        tuned = compiled(base, "tunekit (tuned)")
        tuned.train(train)
        first["tunekit (tuned)"] = first_call(tuned, step)
        print(f"{name} tunekit (tuned): first call {first['tunekit (tuned)']:.1f} s", flush=True)
        after_models = {"eager": base, "compile": models["compile"], "tunekit (tuned)": tuned}
        for variant in ("max-autotune", *extra):
            if variant in models:
                after_models[variant] = models[variant]
        after = alternate(after_models, step, opts.rounds)
        kernels = {v: kernels_per_step(m, step) for v, m in after_models.items()}
        print("kernels per step:", kernels, flush=True)
        row = {
            "before": before, "after": after, "first_call_s": first, "decide_s": decide_s, "kernels": kernels,
            "decide": report.table(), "kept": len(report.kept), "searched": len(report.searched),
            "guarantee": report.steps,
        }  # fmt: skip
        if name == "prefill":
            row["logits_max_diff"] = {v: logits_diff(base, models[v], vocab) for v in ("compile",)}
            row["logits_max_diff"]["tunekit (tuned)"] = logits_diff(base, tuned, vocab)
        result["steps"][name] = row
        (OUT / f"compiled_choices_{opts.model}.json").write_text(json.dumps(result, indent=1, default=str))
        for m in (*models.values(), tuned):
            m.zero_grad(set_to_none=True)
        del models, tuned, after_models
        torch.cuda.empty_cache()

    print(f"\n{opts.model} on {result['device']}: vs compile's default mode in the same alternation; first call s")
    print(f"{'step':8} {'variant':26} {'ms':>8} {'vs compile':>11} {'vs eager':>9} {'1st call s':>11}")
    for name, row in result["steps"].items():
        for phase in ("before", "after"):
            for variant, r in row.get(phase, {}).items():
                again = phase == "after" and variant != "tunekit (tuned)"
                label = f"{variant} (2nd)" if again else variant
                first_s = row["first_call_s"].get(variant)
                shown = "" if first_s is None or again else f"{first_s:.1f}"
                speed = f"{r['ms']:8.3f} {r['vs_compile']:11.3f} {r['vs_eager']:9.3f}"
                print(f"{name:8} {label:26} {speed} {shown:>11}")
        if "decide_s" in row:
            print(f"{name:8} decide_compiled {row['decide_s']:.1f} s, {row['kept']} of {row['searched']} kept")


if __name__ == "__main__":
    main()
