"""Where a plan's tuning time goes in one process: every problem of a plan tuned into an empty cache, either with
one isolation worker shared by the whole plan (`tune --plan` now, tunekit.tuning.shared_bench) or, as before, with
tune() starting its own worker per problem. Prints the wall time and each problem's.

    python tests/gpu/plan_tune_paths.py --path shared|per-problem --plan tests/gpu/plans/qwen2_7b_2layers.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.fleet.plans import read_plan
from tunekit.store.store import Store
from tunekit.tuning.bench import default_timer
from tunekit.tuning.orchestrate import TuneOptions, tune_and_store
from tunekit.tuning.shared_bench import SharedBench


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=("shared", "per-problem"), default="shared")
    parser.add_argument("--plan", type=Path, default=Path("tests/gpu/plans/qwen2_7b_2layers.jsonl"))
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    device, timer, options = fingerprint(), default_timer(), TuneOptions(trials=opts.trials)
    benches = SharedBench(timer) if opts.path == "shared" else None
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Store(tmp) as store:
        for kernel, problem in read_plan(opts.plan):
            spec = get_spec(kernel)
            bench = benches.on_first_use(spec, problem, options.seed) if benches is not None else None
            t0 = time.perf_counter()
            entry, _ = tune_and_store(spec, problem, device, options, store, timer=timer, bench=bench)
            rows.append(
                {"kernel": kernel, "problem": spec.describe_problem(problem), "s": time.perf_counter() - t0,
                 "best_ms": entry.time_ms, "torch_ms": entry.provenance.get("torch_ms")}
            )  # fmt: skip
    wall = time.perf_counter() - start
    if benches is not None:
        benches.close()
    (opts.out / f"plan_tune_{opts.path}.json").write_text(json.dumps({"wall_s": wall, "rows": rows}, indent=1))
    times = sorted(r["s"] for r in rows)
    print(f"{opts.path}: {len(rows)} problems at {opts.trials} trials in {wall:.1f} s on {device.label}; per problem "
          f"median {times[len(times) // 2]:.2f} s, min {times[0]:.2f}, max {times[-1]:.2f}; "
          f"{sum(r['torch_ms'] is not None for r in rows)} with torch's time")


if __name__ == "__main__":
    main()
