"""tunekit inside torch.compile: which ops win there? One family at 7B widths (2 decoder layers, bf16, random
weights). Compile alone against tunekit.patch + compile under several compile policies (the ops traced as tunekit's
own; the rest trace as torch's ops, for Inductor), each policy timed in alternation with compile alone (interleaved
rounds, median of per-round ratios), per step; decode also in mode="reduce-overhead". Compile time of each.

    python tests/gpu/compile_transfer.py --family qwen2 [--policies control,none,all,linear,rms_norm] [--out DIR]

Prints a table last; JSON under --out (default $OUT).
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

import torch
from model_transfer import held_out  # tests/gpu/, beside this script

from tunekit.evaluation.tune_model import _Alternation, default_timer
from tunekit.integrations.patching import patch
from tunekit.runtime import compile_policy


def set_policy(names: frozenset[str]) -> None:
    compile_policy.SWAPPED = names
    torch._dynamo.reset()


def step_of(name: str, ids: dict[str, torch.Tensor]):
    def infer(m) -> None:
        with torch.no_grad():
            m(ids[name], use_cache=False)

    def train(m) -> None:
        m(ids["train"], labels=ids["train"], use_cache=False).loss.backward()

    return train if name == "train" else infer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen2")
    parser.add_argument("--policies", default="none,all,linear,rms_norm")
    parser.add_argument("--steps", default="prefill,decode,train")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    base, ids = held_out(opts.family)
    patched = copy.deepcopy(base)
    patch(patched)
    timer = default_timer(base)
    rows: list[dict] = []
    modes = [("default", s) for s in opts.steps.split(",")] + [("reduce-overhead", "decode")]

    def compiled_call(model, mode: str, step):
        run = torch.compile(model, mode=None if mode == "default" else mode)

        def call() -> None:
            step(run)
            model.zero_grad(set_to_none=True)

        t0 = time.perf_counter()
        call()
        call()  # a second trace where the first call's shapes are marked dynamic
        torch.cuda.synchronize()
        return call, time.perf_counter() - t0

    for mode, step_name in modes:
        step = step_of(step_name, ids)
        base.train(step_name == "train")
        patched.train(step_name == "train")
        set_policy(frozenset())
        alone, alone_s = compiled_call(base, mode, step)
        def eager_call(step=step) -> None:
            step(base)
            base.zero_grad(set_to_none=True)

        for policy in opts.policies.split(","):
            # "control": a second compile of an unpatched copy, which measures the noise of the comparison.
            names = frozenset(compile_policy.OPS) if policy == "all" else frozenset(policy.split("+"))
            set_policy(names - {"none", "control"})
            other = copy.deepcopy(base) if policy == "control" else patched
            mine, mine_s = compiled_call(other, mode, step)
            calls = {"compile": (alone, nullcontext), "tunekit+compile": (mine, nullcontext)}
            calls["eager"] = (eager_call, nullcontext)
            times = _Alternation(timer, opts.rounds, reps=5, warmup=3).run(calls)
            ratio = statistics.median(a / b for a, b in zip(times["compile"], times["tunekit+compile"]))
            vs_eager = statistics.median(a / b for a, b in zip(times["eager"], times["compile"]))
            row = dict(
                step=step_name, mode=mode, policy=policy, vs_compile=ratio, compile_vs_eager=vs_eager,
                compile_ms=statistics.median(times["compile"]), tunekit_ms=statistics.median(times["tunekit+compile"]),
                compile_s=alone_s, tunekit_compile_s=mine_s,
            )  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            del mine, other
            torch.cuda.empty_cache()
        del alone
    set_policy(compile_policy.SWAPPED)
    (opts.out / f"compile_transfer_{opts.family}.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{opts.family} on {torch.cuda.get_device_name()}: tunekit.patch + compile vs compile alone")
    head = f"{'step':8} {'mode':16} {'policy':14} {'vs compile':>10} {'compile vs eager':>16}"
    print(head + f" {'compile s':>9} {'tk s':>7}")
    for r in rows:
        print(
            f"{r['step']:8} {r['mode']:16} {r['policy']:14} {r['vs_compile']:9.3f}x {r['compile_vs_eager']:15.3f}x "
            f"{r['compile_s']:9.1f} {r['tunekit_compile_s']:7.1f}"
        )


if __name__ == "__main__":
    main()
