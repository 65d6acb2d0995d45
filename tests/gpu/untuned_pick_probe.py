"""Zero-trial quality on the GPU: the config an untuned GEMM gets (the ranker's pick, tunekit.tuning.untuned) against
the hand heuristic and torch, on shapes no timing table holds (the three record_tables.py holds out, and random ones).

    python tests/gpu/untuned_pick_probe.py --random 12 --seed 7

Each config is checked against the float64 reference first; times are CUDA events, L2 flushed, median
(triton.testing.do_bench). torch is what a user writes: a @ b, + bias, the activation, + residual.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton.testing

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.kernels.gemm.problem import make_problem
from tunekit.tuning.untuned import model_pick
from tunekit.tuning.verify import verify_config

SPEC = get_spec("gemm")
HELD_OUT = [
    make_problem(2048, 6144, 4096, "bfloat16"),
    make_problem(64, 8192, 8192, "bfloat16"),
    make_problem(1500, 1500, 1500, "bfloat16", activation="relu", has_bias=True),
]
ACTIVATIONS = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def random_problems(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    sizes = [1, 8, 16, 48, 96, 200, 512, 777, 1024, 1536, 2048, 3000, 4096, 5120, 8192, 11008]
    found = []
    while len(found) < count:
        m, n, k = rng.choice(sizes), rng.choice(sizes[3:]), rng.choice(sizes[4:])
        if m * n * k > 2**36:
            continue
        found.append(
            make_problem(
                m,
                n,
                k,
                rng.choice(["bfloat16", "float16"]),
                b_layout=rng.choice(["row", "col"]),
                activation=rng.choice(list(ACTIVATIONS)),
                has_bias=rng.random() < 0.5,
                has_residual=rng.random() < 0.3,
            )
        )
    return found


def torch_call(inputs: tuple[Any, ...]) -> Any:
    a, b, bias, residual, activation, _alpha, _beta = inputs  # the op's defaults: 1 and 1
    act = ACTIVATIONS[activation]

    def run() -> torch.Tensor:
        out = a @ b
        if bias is not None:
            out = out + bias
        out = act(out)
        return out + residual if residual is not None else out

    return run


def time_ms(fn: Any) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--random", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    device, cuda = fingerprint(), torch.device("cuda")
    rows = []
    for problem in HELD_OUT + random_problems(args.random, args.seed):
        inputs = SPEC.make_inputs(problem, cuda, 0)
        outputs = SPEC.alloc_outputs(inputs)
        row: dict[str, Any] = {"problem": SPEC.describe_problem(problem), "torch": time_ms(torch_call(inputs))}
        picks = {"heuristic": dict(SPEC.heuristic(problem, device)), "model": model_pick(SPEC, problem, device)}
        for name, config in picks.items():
            if config is None:
                continue
            wrong = verify_config(SPEC, config, problem, cuda, seed=1)
            row[name] = None if wrong else time_ms(lambda c=config, i=inputs, o=outputs: SPEC.launch(c, i, o))
            row[f"{name}_config"] = config
        rows.append(row)
    out = Path(os.environ.get("OUT", "."))
    (out / "untuned_pick.json").write_text(json.dumps(rows, indent=1))
    print(f"{'problem':92s} {'torch us':>9s} {'heur/torch':>10s} {'model/torch':>11s}")
    ratios: dict[str, list[float]] = {"heuristic": [], "model": []}
    for row in rows:
        cells = []
        for name in ("heuristic", "model"):
            t = row.get(name)
            ratio = row["torch"] / t if t else float("nan")  # > 1: faster than torch
            ratios[name].append(ratio)
            cells.append(f"{ratio:10.2f}x")
        print(f"{row['problem'][:92]:92s} {row['torch'] * 1e3:9.1f} {cells[0]} {cells[1]}")
    for name, values in ratios.items():
        finite = [v for v in values if v == v]
        print(f"{name}: torch/tunekit median {statistics.median(finite):.2f}x, worst {min(finite):.2f}x")
    print(f"model beats heuristic on {sum(m > h for h, m in zip(ratios['heuristic'], ratios['model']))}/{len(rows)}")


if __name__ == "__main__":
    main()
