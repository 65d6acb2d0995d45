"""`--budget 60` against a full 8-trial tune, at the model level (the one-minute target). One family at 7B
widths (model_transfer.py's: 2 decoder layers, bf16, random weights), no shipped packs (remove cache/packs/*.json
first, so an untuned problem is served by torch, not by a pack):

1. `tunekit.tune_model` with `budget_s` (record, tune under the budget from empty tunekit and Triton caches, verify,
   demote) into cache A;
2. the same at the trial count alone into cache B (Triton's cache now warm: its time is not the comparison);
3. the steps timed in alternation: eager, tunekit served by A, tunekit served by B (median of per-round ratios).

    rm -f cache/packs/*.json; python tests/gpu/budget_vs_trials.py --family qwen2 --budget 60 --trials 8

Prints a table last; JSON under $OUT.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from model_transfer import held_out, steps

from tunekit.evaluation.model_workflow import serving_from
from tunekit.evaluation.step_timing import Alternation, default_timer
from tunekit.evaluation.tune_model import tune_model
from tunekit.integrations.patching import patch
from tunekit.store.entry import TORCH_MS
from tunekit.store.store import Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen2")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    opts = parser.parse_args()
    out = Path(os.environ.get("OUT", "/tmp"))
    work = Path(tempfile.mkdtemp(prefix="budget-vs-trials-"))
    os.environ["TRITON_CACHE_DIR"] = str(work / "triton")  # both tunes compile from an empty Triton cache first
    base, ids = held_out(opts.family)
    step_fns = steps(ids)
    tk = copy.deepcopy(base)
    patch(tk)
    record: dict = {"family": opts.family, "device": torch.cuda.get_device_name(), "budget_s": opts.budget}
    caches = {"budget": work / "budget", "trials": work / "trials"}
    for name, budget in (("budget", opts.budget), ("trials", None)):
        t0 = time.perf_counter()
        with serving_from(caches[name]):
            report = tune_model(tk, step_fns, trials=opts.trials, budget_s=budget, eager=base, rounds=5)
        record[name] = {**asdict(report), "wall_s": round(time.perf_counter() - t0, 1), "table": report.table()}
        print(
            f"{name}: tune {report.tune_s:.1f} s, {report.tuned} tuned, {len(report.unreached)} unreached, "
            f"{len(report.demoted)} demoted; whole tune_model {record[name]['wall_s']} s",
            flush=True,
        )
        print(report.table(), flush=True)

    for name, cache in caches.items():  # per problem: configs measured, the best's ms, torch's ms
        with Store(cache) as store:
            record[name]["entries"] = {
                f"{e.key.kernel} {dict(e.key.problem)}": [len(e.trials), e.time_ms, e.provenance.get(TORCH_MS)]
                for e in store.entries()
            }
    timer = default_timer(base)
    speeds: dict = {}
    for step_name, step in step_fns.items():
        calls = {}
        for variant, model, context in (
            ("eager", base, nullcontext),
            ("budget", tk, partial(serving_from, caches["budget"])),
            ("trials", tk, partial(serving_from, caches["trials"])),
        ):
            model.train(step_name == "train")

            def call(model=model, step=step) -> None:
                step(model)
                model.zero_grad(set_to_none=True)

            calls[variant] = (call, context)
        times = Alternation(timer, opts.rounds, reps=5, warmup=3).run(calls)
        speeds[step_name] = {
            "eager ms": statistics.median(times["eager"]),
            "budget vs eager": statistics.median(e / t for e, t in zip(times["eager"], times["budget"])),
            "trials vs eager": statistics.median(e / t for e, t in zip(times["eager"], times["trials"])),
            "budget vs trials": statistics.median(t / b for t, b in zip(times["trials"], times["budget"])),
        }
    record["speeds"] = speeds
    (out / f"budget_vs_trials_{opts.family}.json").write_text(json.dumps(record, indent=1, default=str))
    b, t = record["budget"], record["trials"]
    print(
        f"\ntune: --budget {opts.budget:g}: {b['tune_s']:.1f} s ({b['tuned']} tuned, {len(b['unreached'])} unreached); "
        f"{opts.trials} trials: {t['tune_s']:.1f} s ({t['tuned']} tuned)"
    )
    print(f"{'step':<9} {'eager ms':>9} {'budget':>8} {'trials':>8} {'budget/trials':>14}")
    for step_name, s in speeds.items():
        print(
            f"{step_name:<9} {s['eager ms']:9.3f} {s['budget vs eager']:7.3f}x {s['trials vs eager']:7.3f}x "
            f"{s['budget vs trials']:13.3f}x"
        )


if __name__ == "__main__":
    main()
