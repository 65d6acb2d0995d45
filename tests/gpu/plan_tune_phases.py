"""Where a plan's tuning seconds go, per phase, with the old settings and the new: every problem of a plan tuned into
an empty cache (and an empty Triton cache) in one process through SharedBench.tune, the one per-problem path of
`tune --plan` and fleet workers, first as before (--trials, search to the trial budget), then with the model's early
stop (tunekit/tuning/early_stop.py) and each problem's first configs compiled ahead on the host's cores
(tunekit/tuning/precompile.py; --precompile 0 turns it off). Prints seconds per problem by phase
(tunekit/tuning/phases.py), the wall time, and a cheap model-step check: the plan's served time, the sum over
problems of min(tuned, torch), which the new settings should keep within 2% of the old. Each setting stops taking
new problems after --cap-s seconds (the table says how many it finished), so the script ends in under 8 minutes.
Details go to $OUT/plan_tune_phases.json.

    python tests/gpu/plan_tune_phases.py --plan tests/gpu/plans/qwen2_7b_2layers.jsonl --trials 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tunekit.core.device import fingerprint
from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.fleet.plans import read_plan
from tunekit.store.entry import torch_time
from tunekit.store.store import Store
from tunekit.tuning.orchestrate import TuneOptions
from tunekit.tuning.phases import PHASES, PhaseTimes
from tunekit.tuning.shared_bench import SharedBench


def run(plan: Path, options: TuneOptions, cap_s: float) -> dict[str, Any]:
    """Tune the plan with `options` in a fresh cache and a fresh Triton cache; rows per problem."""
    device = fingerprint()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")  # the isolation worker inherits it
        start = time.perf_counter()
        benches = SharedBench()
        work = [(get_spec(k), p) for k, p in read_plan(plan)]
        try:
            with Store(Path(tmp) / "cache") as store:
                for spec, problem in work:
                    if time.perf_counter() - start > cap_s:
                        break
                    phases, t0 = PhaseTimes(), time.perf_counter()
                    row: dict[str, Any] = {"kernel": spec.name, "problem": spec.describe_problem(problem)}
                    try:
                        entry, report = benches.tune(spec, problem, device, options, store, phases=phases)
                        row |= {"best_ms": entry.time_ms, "torch_ms": torch_time(entry.provenance),
                                "measured": report.benchmarked, "stop": report.stop_reason}  # fmt: skip
                    except TunekitError as exc:
                        row["failed"] = str(exc)[:200]
                    row |= {"s": time.perf_counter() - t0, "phases": phases.to_json()}
                    rows.append(row)
                    print(f"  {row['kernel']} {row['problem'][:60]}: {row['s']:.2f} s, {row.get('stop', 'failed')}",
                          flush=True)
        finally:
            benches.close()
        wall = time.perf_counter() - start
    return {"wall_s": wall, "planned": len(work), "rows": rows, "trials": options.trials,
            "early_stop": options.early_stop, "precompile_threads": options.precompile_threads}  # fmt: skip


def served_ms(rows: list[dict[str, Any]]) -> float:
    """The plan's time as dispatch serves it: each problem's tuned time, or torch's where torch is faster."""
    return sum(min(r["best_ms"], r["torch_ms"] or r["best_ms"]) for r in rows if "best_ms" in r)


def table(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    keys = [{(row["kernel"], row["problem"]) for row in results[n]["rows"]} for n in names]
    common = set.intersection(*keys) if keys else set()
    print(f"\nseconds per problem, by phase (tunekit/tuning/phases.py), over the {len(common)} problems all finished")
    print("| phase | " + " | ".join(names) + " |")
    print("| --- | " + " | ".join("---" for _ in names) + " |")
    rows = {n: [row for row in results[n]["rows"] if (row["kernel"], row["problem"]) in common] for n in names}
    totals = {n: PhaseTimes.summed(row["phases"] for row in rows[n]).to_json() for n in names}
    count = {n: max(1, len(rows[n])) for n in names}
    for phase in PHASES:
        print(f"| {phase} | " + " | ".join(f"{totals[n][phase] / count[n]:.2f}" for n in names) + " |")
    print("| per problem | " + " | ".join(f"{sum(totals[n].values()) / count[n]:.2f}" for n in names) + " |")
    for n in names:
        r = results[n]
        times = [row["s"] for row in r["rows"]] or [0.0]
        measured = sum(row.get("measured", 0) for row in r["rows"])
        print(f"{n}: {len(r['rows'])}/{r['planned']} problems in {r['wall_s']:.1f} s wall "
              f"(median {statistics.median(times):.2f} s, max {max(times):.2f} s per problem), {measured} configs "
              f"measured, {sum('failed' in row for row in r['rows'])} failed; served plan time "
              f"{served_ms(r['rows']):.4f} ms")  # fmt: skip
    first, *rest = names
    for n in rest:
        common = {(row["kernel"], row["problem"]) for row in results[n]["rows"] if "best_ms" in row}
        base = [row for row in results[first]["rows"] if (row["kernel"], row["problem"]) in common]
        new = [row for row in results[n]["rows"] if (row["kernel"], row["problem"]) in common]
        if base and served_ms(base):
            print(f"model-step check on the {len(common)} problems both finished: {n} serves "
                  f"{served_ms(new) / served_ms(base):.4f}x the {first} plan time (target <= 1.02)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", type=Path, default=Path("tests/gpu/plans/qwen2_7b_2layers.jsonl"))
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--early-stop", type=float, default=0.03, help="the new setting's timing noise")
    parser.add_argument("--precompile", type=int, default=os.cpu_count() or 1, help="the new setting's threads")
    parser.add_argument("--cap-s", type=float, default=200.0, help="seconds per setting before it stops")
    parser.add_argument("--only", choices=("before", "after"), default=None)
    opts = parser.parse_args()
    settings = {
        "before": TuneOptions(trials=opts.trials),
        "after": TuneOptions(trials=opts.trials, early_stop=opts.early_stop, precompile_threads=opts.precompile),
    }
    results: dict[str, dict[str, Any]] = {}
    for name, options in settings.items():
        if opts.only not in (None, name):
            continue
        print(f"{name}: trials {options.trials}, early stop {options.early_stop}, precompile threads "
              f"{options.precompile_threads} on {fingerprint().label}", flush=True)  # fmt: skip
        results[name] = run(opts.plan, options, opts.cap_s)
    table(results)
    out = os.environ.get("OUT")
    if out:
        Path(out, "plan_tune_phases.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
