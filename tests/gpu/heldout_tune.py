"""Tune GEMM shapes no timing table holds (the three shapes record_tables.py holds out, and a few more) with the default
`model` strategy on this GPU, and print how the best config so far compares with torch after 1, 3, 5, 10 and 20
trials.

    python tests/gpu/heldout_tune.py --trials 20

The tuner runs as `tunekit tune` runs it (isolated candidates, each verified before it is timed); torch is a @ b,
+ bias, the activation, + residual, timed the same way (CUDA events, L2 flushed, median).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from untuned_pick_probe import HELD_OUT, time_ms, torch_call

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.kernels.gemm.problem import make_problem
from tunekit.store.entry import TrialRecord
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune

SPEC = get_spec("gemm")
MORE = [
    make_problem(4000, 4000, 1000, "bfloat16", b_layout="col", activation="gelu", has_bias=True),
    make_problem(24, 14336, 4096, "bfloat16", b_layout="col"),
    make_problem(1111, 2222, 3333, "float16", has_residual=True),
]
CHECKPOINTS = (1, 3, 5, 10, 20)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    device, cuda = fingerprint(), torch.device("cuda")
    rows = []
    for problem in HELD_OUT + MORE:
        inputs = SPEC.make_inputs(problem, cuda, 0)
        torch_ms = time_ms(torch_call(inputs))
        times: list[float] = []

        def seen(record: TrialRecord, n: int, times: list[float] = times) -> None:
            times.append(record.time_ms if record.status == "ok" and record.time_ms else float("inf"))

        report = tune(SPEC, problem, device, TuneOptions(trials=args.trials, sampler="model"), on_trial=seen)
        best_so_far = [min(times[:n]) for n in range(1, len(times) + 1)]
        row: dict[str, Any] = {
            "problem": SPEC.describe_problem(problem),
            "torch_ms": torch_ms,
            "trial_ms": times,
            "winner": dict(report.entry.config),
            "winner_ms": report.entry.time_ms,
        }
        row["torch_over_best_after"] = {n: torch_ms / best_so_far[n - 1] for n in CHECKPOINTS if n <= len(times)}
        rows.append(row)
        print(json.dumps({"problem": row["problem"][:60], **row["torch_over_best_after"]}), flush=True)
    (Path(os.environ.get("OUT", ".")) / "heldout_tune.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'problem':70s} {'torch us':>9s} " + " ".join(f"@{n:<5d}" for n in CHECKPOINTS))
    for row in rows:
        cells = " ".join(f"{row['torch_over_best_after'].get(n, float('nan')):5.2f}x" for n in CHECKPOINTS)
        print(f"{row['problem'][:70]:70s} {row['torch_ms'] * 1e3:9.1f} {cells}")
    print("(torch time / best tunekit config after N trials: > 1 is faster than torch)")


if __name__ == "__main__":
    main()
