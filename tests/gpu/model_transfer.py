"""Does tuning transfer to the model? One family at 7B widths (2 decoder layers, bf16, random weights), as a user
runs it: every step timed in alternation (interleaved rounds, median of per-round speedups vs eager) for eager,
tunekit out of the box, torch.compile and Liger-Kernel; then `tunekit.tune_model` (record, tune, verify, demote);
then the same alternation with the tuned entries, and the training step's GPU time by kernel kind, eager vs tuned.

    python tests/gpu/model_transfer.py --family qwen2 --trials 4 [--budget SECONDS] [--out DIR]

Prints the tables last; JSON under --out (default $OUT).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tunekit.evaluation.model_bench import _modeling_state, _restore, _variant, build
from tunekit.evaluation.model_results import Workload
from tunekit.evaluation.step_profile import kind_table, profile_kinds
from tunekit.evaluation.step_timing import Alternation, default_timer
from tunekit.evaluation.tune_model import tune_model
from tunekit.integrations import inductor_outer_products
from tunekit.integrations.patching import patch

SIZES = {"prefill": (4, 1024), "decode": (8, 1), "train": (2, 1024)}
WIDTHS = {"qwen2": (3584, 152064), "mistral": (4096, 32000), "llama": (4096, 32000), "gemma": (2048, 256000)}


def held_out(family: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The family's model at its 7B-class widths (2 layers, bf16, random weights) and each step's token ids."""
    hidden, vocab = WIDTHS[family]
    base = build(Workload(family, hidden=hidden, vocab=vocab, **SIZES), torch.device("cuda"), torch.bfloat16)
    gen = torch.Generator(device="cpu").manual_seed(1)
    return base, {k: torch.randint(0, vocab, v, generator=gen).to("cuda") for k, v in SIZES.items()}


def steps(ids: dict[str, torch.Tensor]) -> dict:
    def infer(name: str):
        def step(m: torch.nn.Module) -> Any:
            with torch.no_grad():
                return m(ids[name], use_cache=False)

        return step

    def train(m: torch.nn.Module) -> None:
        m(ids["train"], labels=ids["train"], use_cache=False).loss.backward()

    return {"prefill": infer("prefill"), "decode": infer("decode"), "train": train}


def alternate(variants: dict, step_fns: dict, rounds: int) -> dict[str, dict[str, float]]:
    """Per step: each variant's median ms and its median per-round speedup vs eager."""
    out: dict[str, dict[str, float]] = {}
    timer = default_timer(next(iter(variants.values()))[0])
    for name, step in step_fns.items():
        calls = {}
        for variant, (model, run, context) in variants.items():
            model.train(name == "train")

            def call(model=model, run=run, step=step) -> None:
                step(run)
                model.zero_grad(set_to_none=True)

            calls[variant] = (call, context)
        times = Alternation(timer, rounds, reps=5, warmup=3).run(calls)
        for variant in variants:
            ratios = [e / t for e, t in zip(times["eager"], times[variant])]
            out.setdefault(name, {})[variant] = statistics.median(ratios)
            out[name][variant + " ms"] = statistics.median(times[variant])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen2")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=None, help="tune_model's budget_s (tune --budget)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    hidden, vocab = WIDTHS[opts.family]
    base, ids = held_out(opts.family)
    step_fns = steps(ids)
    record: dict = {"family": opts.family, "hidden": hidden, "vocab": vocab, "device": torch.cuda.get_device_name()}

    clean = _modeling_state(opts.family)
    variants: dict = {"eager": (base, base, nullcontext)}
    tk = copy.deepcopy(base)
    patch(tk)
    variants["tunekit"] = (tk, tk, nullcontext)
    if not opts.no_compile:
        compiled = copy.deepcopy(base)
        # compile alone compiles its own graph (not with the outer-product pass tunekit.patch installed above)
        variants["compile"] = (compiled, torch.compile(compiled), inductor_outer_products.disabled)
    try:
        liger_model, _ = _variant(base, "liger", opts.family)
        liger_state = _modeling_state(opts.family)
        _restore(clean)

        class Liger:  # its global patch in place only while its own calls run
            def __enter__(self) -> None:
                _restore(liger_state)

            def __exit__(self, *exc: object) -> None:
                _restore(clean)

        variants["liger"] = (liger_model, liger_model, Liger)
    except Exception as exc:
        record["liger"] = str(exc)
    t0 = time.perf_counter()
    record["out_of_box"] = alternate(variants, step_fns, opts.rounds)
    record["out_of_box_s"] = time.perf_counter() - t0

    # tk is patched already (patching twice changes nothing); eager is the unpatched base.
    plan = opts.out / f"plan_{opts.family}.jsonl"
    report = tune_model(tk, step_fns, trials=opts.trials, budget_s=opts.budget, plan=plan, eager=base, rounds=5)
    record["tune_model"] = {**asdict(report), "table": report.table()}
    print(report.table(), flush=True)

    from tunekit.runtime.dispatch import reset_all

    reset_all()
    record["tuned"] = alternate(variants, step_fns, opts.rounds)
    peak = {}
    for name in ("eager", "tunekit"):
        model = variants[name][0]
        model.train()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step_fns["train"](model)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peak[name] = (torch.cuda.max_memory_allocated() - before) / 2**30
    record["train_peak_gib_above_weights"] = peak
    kinds = {}
    for name in ("eager", "tunekit"):
        model = variants[name][0]
        model.train()

        def train_step(model=model) -> None:
            step_fns["train"](model)
            model.zero_grad(set_to_none=True)

        kinds[name] = profile_kinds(train_step)
    record["train_kinds"] = kinds
    (opts.out / f"model_transfer_{opts.family}.json").write_text(json.dumps(record, indent=1, default=str))

    print(f"\n{opts.family} ({hidden} wide, vocab {vocab}, 2 layers, bf16) on {record['device']}: speed vs eager")
    cols = [v for v in variants if v != "eager"]
    print(f"{'step':8} " + " ".join(f"{c + ' (box)':>16}" for c in cols) + f" {'tunekit tuned':>14}")
    for name in step_fns:
        box = record["out_of_box"][name]
        print(f"{name:8} " + " ".join(f"{box[c]:15.3f}x" for c in cols) + f" {record['tuned'][name]['tunekit']:13.3f}x")
    print("eager ms: " + ", ".join(f"{n} {record['out_of_box'][n]['eager ms']:.3f}" for n in step_fns))
    print(f"train peak GiB above weights: eager {peak['eager']:.2f}, tunekit {peak['tunekit']:.2f}")
    print(kind_table(kinds, "train step GPU ms by kernel kind (tuned)"))


if __name__ == "__main__":
    main()
