"""tunekit inside torch.compile: which ops win there? One family at 7B widths (2 decoder layers, bf16, random
weights). Compile alone against tunekit.patch + compile under several compile policies (the ops traced as tunekit's
own; the rest trace as torch's ops, for Inductor), each policy timed in alternation with compile alone (interleaved
rounds, median of per-round ratios), per step; decode also in mode="reduce-overhead". Compile time of each.

    python tests/gpu/compile_transfer.py --family qwen2 [--policies control,measured,all,linear] [--mark] [--out DIR]

Policies: `measured` is the default (a kernel serves under compile where its entry beats Inductor's time for the
problem); `all`, `none` or op names force TUNEKIT_COMPILE_OPS's choice. --mark first times Inductor's candidate for
every entry of the store (TUNEKIT_CACHE_DIR) that serves a kernel, so that `measured` has times to choose by.

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
import torch._inductor.config
from model_transfer import held_out  # tests/gpu/, beside this script

from tunekit.core.device import fingerprint
from tunekit.evaluation.compile_verify import verify_under_compile
from tunekit.evaluation.step_timing import Alternation, default_timer
from tunekit.integrations import inductor_outer_products
from tunekit.integrations.patching import patch
from tunekit.runtime import compile_policy, dispatch
from tunekit.runtime.dispatch import serves_kernel
from tunekit.store.store import Store
from tunekit.tuning.bench import default_timer as kernel_timer
from tunekit.tuning.inductor_candidate import mark_under_compile


def set_policy(policy: str) -> None:
    """measured (None), or the ops forced: all, none, a +-list of op names; control forces none."""
    if policy == "measured":
        compile_policy.FORCED = None
    elif policy == "all":
        compile_policy.FORCED = frozenset({compile_policy.ALL})
    else:
        compile_policy.FORCED = frozenset(policy.split("+")) - {"none", "control"}
    dispatch.reset_all()
    torch._dynamo.reset()


def mark(family: str) -> dict[str, int]:
    """Time Inductor's candidate for the store's kernel-serving entries; how many were timed and chosen."""
    device = fingerprint()
    t0 = time.perf_counter()
    with Store() as store:
        updated = mark_under_compile(store, device, lambda spec, e: serves_kernel(spec, e, device), kernel_timer())
    chosen = [e for e in updated if compile_policy.beats_inductor(e)] if compile_policy.FORCED is None else []
    for e in updated:
        times = e.provenance["under_compile"]
        problem = ",".join(f"{v}" for v in dict(e.key.problem).values())
        print(f"  {e.key.kernel:18} {problem[:60]:60} eager {e.time_ms:.4f} compiled {times['kernel_ms']:.4f} "
              f"inductor {times['inductor_ms']:.4f} ms", flush=True)  # fmt: skip
    return {"timed": len(updated), "chosen": len(chosen), "seconds": round(time.perf_counter() - t0, 1)}


def step_of(name: str, ids: dict[str, torch.Tensor]):
    def infer(m) -> None:
        with torch.no_grad():
            m(ids[name], use_cache=False)

    def train(m) -> None:
        m(ids["train"], labels=ids["train"], use_cache=False).loss.backward()

    return train if name == "train" else infer


def verify(patched, ids, step_names: list[str]) -> list[dict]:
    """tunekit.evaluation.compile_verify over the steps: which kernels' choices the compiled model keeps."""
    set_policy("measured")

    def zeroed(step):
        def call(m) -> None:
            step(m)
            m.zero_grad(set_to_none=True)

        return call

    steps = {}
    for name in step_names:
        patched.train(name == "train")
        steps[name] = zeroed(step_of(name, ids))
    t0 = time.perf_counter()
    patched.train(True)  # the training step needs it; inference steps run under no_grad either way
    verdicts = verify_under_compile(patched, steps)
    out = [{"kernels": v.kernels, "ratios": v.ratios, "kept": v.kept} for v in verdicts]
    for v in out:
        print("verdict", json.dumps(v), flush=True)
    print(f"verified in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def agreement(base, other, mode: str, step_name: str, ids) -> dict[str, float]:
    """Prefill logits (or the training loss) of this compiled model and of compile alone, against eager: the
    largest difference of each (compile's own difference is the yardstick)."""
    if step_name == "decode":
        return {}
    key = ids["train"] if step_name == "train" else ids[step_name]

    def out(m):
        with torch.no_grad():
            r = m(key, labels=key, use_cache=False) if step_name == "train" else m(key, use_cache=False)
        return (r.loss if step_name == "train" else r.logits).float()

    eager = out(base)
    mine = out(torch.compile(other))
    with inductor_outer_products.disabled():  # compile alone: its own graph
        alone = out(torch.compile(base))
    return {"diff_tunekit": float((mine - eager).abs().max()), "diff_compile": float((alone - eager).abs().max())}


# Inductor passes a kernel's Python-float arguments as fp64 (its `_use_fp64_for_unbacked_floats`), which turns
# fp32 epilogue math into fp64; TUNEKIT_FP32_SCALARS=1 measures with fp32 scalars, as Triton's own JIT passes them.
if os.environ.get("TUNEKIT_FP32_SCALARS") == "1":
    torch._inductor.config._use_fp64_for_unbacked_floats = False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen2")
    parser.add_argument("--policies", default="control,measured,all")
    parser.add_argument("--mark", action="store_true")
    parser.add_argument("--verify", action="store_true", help="check the choices in the compiled model steps")
    parser.add_argument("--steps", default="prefill,decode,train")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    marked = mark(opts.family) if opts.mark else None
    print(f"inductor candidates: {marked}", flush=True)
    base, ids = held_out(opts.family)
    patched = copy.deepcopy(base)
    patch(patched)
    verdicts = verify(patched, ids, opts.steps.split(",")) if opts.verify else []
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
        set_policy("none")
        alone, alone_s = compiled_call(base, mode, step)

        def eager_call(step=step) -> None:
            step(base)
            base.zero_grad(set_to_none=True)

        for policy in opts.policies.split(","):
            # "control": a second compile of an unpatched copy, which measures the noise of the comparison.
            set_policy(policy)
            other = copy.deepcopy(base) if policy == "control" else patched
            try:
                mine, mine_s = compiled_call(other, mode, step)
                agree = agreement(base, other, mode, step_name, ids) if mode == "default" else {}
            except Exception as exc:  # report the policy that fails to compile, go on with the rest
                print(json.dumps({"step": step_name, "mode": mode, "policy": policy, "error": repr(exc)[:400]}))
                continue
            calls = {"compile": (alone, nullcontext), "tunekit+compile": (mine, nullcontext)}
            calls["eager"] = (eager_call, nullcontext)
            times = Alternation(timer, opts.rounds, reps=5, warmup=3).run(calls)
            ratio = statistics.median(a / b for a, b in zip(times["compile"], times["tunekit+compile"]))
            vs_eager = statistics.median(a / b for a, b in zip(times["eager"], times["compile"]))
            row = dict(
                step=step_name, mode=mode, policy=policy, vs_compile=ratio, compile_vs_eager=vs_eager,
                compile_ms=statistics.median(times["compile"]), tunekit_ms=statistics.median(times["tunekit+compile"]),
                compile_s=alone_s, tunekit_compile_s=mine_s, **agree,
            )  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            del mine, other
            torch.cuda.empty_cache()
        del alone
    set_policy("measured")
    result = {"marked": marked, "verdicts": verdicts, "rows": rows}
    (opts.out / f"compile_transfer_{opts.family}.json").write_text(json.dumps(result, indent=1))
    print(f"\n{opts.family} on {torch.cuda.get_device_name()}: tunekit.patch + compile vs compile alone")
    head = f"{'step':8} {'mode':16} {'policy':9} {'vs compile':>10} {'compile/eager':>13}"
    print(head + f" {'compile s':>9} {'tk s':>6} {'diff tk':>8} {'diff cmp':>8}")
    for r in rows:
        print(
            f"{r['step']:8} {r['mode']:16} {r['policy']:9} {r['vs_compile']:9.3f}x {r['compile_vs_eager']:12.3f}x "
            f"{r['compile_s']:9.1f} {r['tunekit_compile_s']:6.1f} {r.get('diff_tunekit', 0):8.4f} "
            f"{r.get('diff_compile', 0):8.4f}"
        )


if __name__ == "__main__":
    main()
