"""Token buckets on a GPU: is a token count between two tuned bucket edges served at least as fast as torch?

For a few layer shapes of a 7B model (Qwen2-7B: hidden 3584, MLP 18944; bf16, linear layers as tunekit.ops.linear
records them: A row-major [M, K], B the weight's transpose, column-major), this
1. tunes the bucket edges around a set of in-between token counts (GEMM: the edges of tunekit/core/buckets.py, few
   trials, one shared isolation worker, into a temporary store; RMSNorm: the power-of-two row bucket its key already
   is), within a tuning budget;
2. for each in-between M, times the upper edge's config (what the bucket layer serves) and torch's own op on the
   same random inputs of exactly M rows: median of CUDA-event timings, L2 flushed before each call (triton's
   do_bench);
3. prints, per M: the bucket, each edge's recorded speed-up over torch, the layer dispatch resolves for M (bucket,
   or torch where the rule refuses), torch / bucket-config time (> 1: the config is faster), and the served time
   against torch's (the number the rule promises is >= 1, up to the timing noise).

    python tests/gpu/m_buckets.py [--trials 6] [--tune-budget-s 200] [--rep-ms 40] [--out $OUT]

Takes about 3-5 minutes on an H100/H200 (the tuning budget caps step 1: edges left untuned are listed, their rows
left out). Writes m_buckets.json and m_buckets.txt under --out ($OUT if set). `--smoke` runs the same steps on tiny
shapes in Triton's interpreter (CPU, wall-clock timings that mean nothing): a check that the script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton.testing

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.core.spec import row_bucket
from tunekit.evaluation.step_timing import median_ms
from tunekit.kernels.gemm.problem import make_problem
from tunekit.runtime import buckets, dispatch
from tunekit.store.entry import torch_time
from tunekit.store.key import CacheKey
from tunekit.store.store import Store
from tunekit.tuning.bench import default_timer
from tunekit.tuning.orchestrate import TuneOptions, tune_and_store
from tunekit.tuning.shared_bench import SharedBench

HIDDEN, MLP = 3584, 18944
GEMMS = {  # name: (n, k); m is the token count
    "o_proj 3584x3584": (HIDDEN, HIDDEN),
    "down_proj 3584x18944": (HIDDEN, MLP),
    "up_proj 18944x3584": (MLP, HIDDEN),
}
GEMM_MS = (72, 100, 120, 300, 330, 600, 700, 900, 1000, 1300, 1800, 2000)
NORM_MS = (100, 600, 1000, 1500, 3000)
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def smoke() -> None:
    """Tiny shapes for a CPU run of the script (the interpreter)."""
    global HIDDEN, GEMMS, GEMM_MS, NORM_MS
    HIDDEN, GEMMS, GEMM_MS, NORM_MS = 32, {"tiny 32x48": (32, 48)}, (6,), (6,)


def gemm_problem(m: int, n: int, k: int) -> dict[str, Any]:
    return dict(make_problem(m, n, k, "bfloat16", b_layout="col"))


def norm_problem(rows: int) -> dict[str, Any]:
    return {"rows": rows, "cols": HIDDEN, "dtype": "bfloat16", "weight": True}


def timed_ms(call: Callable[[], object], rep_ms: float) -> float:
    """Median of CUDA-event timings of `call` over about `rep_ms` of calls, L2 flushed before each (triton's
    do_bench); --smoke: the wall clock."""
    if not ON_GPU:
        return median_ms(call, 3, on_gpu=False)
    return float(triton.testing.do_bench(call, warmup=10, rep=rep_ms, return_mode="median"))


def tune_edges(plan: list[tuple[str, dict[str, Any]]], store: Store, trials: int, budget_s: float) -> list[str]:
    """Tune each (kernel, problem) of `plan` into `store` until the budget is spent; returns what was skipped."""
    device, timer = fingerprint(), default_timer()
    bench = SharedBench(timer)
    options = TuneOptions(trials=trials)
    skipped: list[str] = []
    start = time.perf_counter()
    try:
        for kernel, problem in plan:
            spec = get_spec(kernel)
            if time.perf_counter() - start > budget_s:
                skipped.append(f"{kernel} {spec.describe_problem(problem)}")
                continue
            t0 = time.perf_counter()
            entry, _ = tune_and_store(
                spec, problem, device, options, store, timer=timer, bench=bench.on_first_use(spec, problem, 0)
            )
            torch_ms = torch_time(entry.provenance)
            print(
                f"  tuned {kernel} {spec.describe_problem(problem)}: {entry.time_ms:.4f} ms, torch "
                f"{torch_ms if torch_ms is None else round(torch_ms, 4)} ms ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    finally:
        bench.close()
    return skipped


def edge_plan() -> list[tuple[str, dict[str, Any]]]:
    declared = get_spec("gemm").token_buckets
    assert declared is not None
    plan: dict[str, tuple[str, dict[str, Any]]] = {}
    for n, k in GEMMS.values():
        for m in GEMM_MS:
            for edge in declared.representatives(gemm_problem(m, n, k)):
                plan.setdefault(json.dumps(edge, sort_keys=True), ("gemm", edge))
    for m in NORM_MS:
        plan.setdefault(f"rmsnorm {row_bucket(m)}", ("rmsnorm", norm_problem(row_bucket(m))))
    # small problems first: a budget cut skips the largest
    return sorted(plan.values(), key=lambda kp: (kp[0] != "rmsnorm", kp[1].get("m", 0) * kp[1].get("n", 1)))


def measure(kernel: str, label: str, problem: dict[str, Any], edge_problem: dict[str, Any], store: Store,
            rep_ms: float) -> dict[str, Any] | None:  # fmt: skip
    """One row: the edge config (tuned at `edge_problem`) and torch, both on `problem`'s inputs."""
    spec, device = get_spec(kernel), fingerprint()
    edge = store.get(CacheKey.make(spec.name, spec.source_hash, device.key, edge_problem))
    if edge is None:
        return None
    res = dispatch.resolve(spec, problem if kernel == "gemm" else edge_problem, device, store)
    inputs = spec.make_inputs(problem, DEVICE, 1)
    outputs = spec.alloc_outputs(inputs)
    assert spec.torch_baseline is not None
    baseline = spec.torch_baseline

    def run_config() -> None:
        spec.launch(edge.config, inputs, outputs)

    config_ms = timed_ms(run_config, rep_ms)
    torch_ms = timed_ms(lambda: baseline(inputs), rep_ms)
    want = baseline(inputs)[0].float()
    ok = bool(torch.allclose(outputs[0].float(), want, atol=5e-2, rtol=5e-2))
    served_ms = torch_ms if res.config is dispatch.TORCH else config_ms
    field = "m" if kernel == "gemm" else "rows"
    return {
        "shape": label, "m": problem[field], "layer": res.layer, "note": res.note, "edge": edge_problem[field],
        "config": dict(edge.config), "config_ms": config_ms, "torch_ms": torch_ms,
        "config_speedup": torch_ms / config_ms, "served_vs_torch": torch_ms / served_ms, "correct": ok,
    }  # fmt: skip


def edge_speedups(kernel: str, problem: dict[str, Any], store: Store) -> str:
    spec, device = get_spec(kernel), fingerprint()
    declared = spec.token_buckets
    bracket = declared.bracket(problem) if declared is not None else None
    edges = [problem] if bracket is None or declared is None else [declared.at(problem, e) for e in bracket]
    parts = []
    for edge in edges:
        entry = store.get(CacheKey.make(spec.name, spec.source_hash, device.key, edge))
        torch_ms = None if entry is None else torch_time(entry.provenance)
        parts.append("-" if entry is None or torch_ms is None else f"{torch_ms / entry.time_ms:.2f}")
    return "/".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--tune-budget-s", type=float, default=200.0)
    parser.add_argument("--rep-ms", type=float, default=40.0, help="timing per measurement (triton do_bench's rep)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes in the interpreter (CPU): does it run")
    opts = parser.parse_args()
    if opts.smoke:
        smoke()
    elif not ON_GPU:
        sys.exit("m_buckets.py needs a CUDA GPU (or --smoke)")
    t0 = time.perf_counter()
    device = fingerprint()
    print(f"{device.label}; bucket margin {buckets.BUCKET_MARGIN}x; trials {opts.trials}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, Store(tmp) as store:
        plan = edge_plan()
        print(f"tuning {len(plan)} edge problems (budget {opts.tune_budget_s:.0f} s)", flush=True)
        skipped = tune_edges(plan, store, opts.trials, opts.tune_budget_s)
        tuned_s = time.perf_counter() - t0
        declared = get_spec("gemm").token_buckets
        assert declared is not None
        for label, (n, k) in GEMMS.items():
            for m in GEMM_MS:
                problem = gemm_problem(m, n, k)
                bracket = declared.bracket(problem)
                hi = bracket[1] if bracket is not None else m
                row = measure("gemm", label, problem, gemm_problem(hi, n, k), store, opts.rep_ms)
                if row is not None:
                    rows.append(row | {"bucket": bracket, "edges_vs_torch": edge_speedups("gemm", problem, store)})
        for m in NORM_MS:
            row = measure("rmsnorm", f"rmsnorm {HIDDEN}", norm_problem(m), norm_problem(row_bucket(m)), store,
                          opts.rep_ms)  # fmt: skip
            if row is not None:
                edge = norm_problem(row_bucket(m))
                rows.append(row | {"bucket": (row_bucket(m) // 2, row_bucket(m)),
                                   "edges_vs_torch": edge_speedups("rmsnorm", edge, store)})  # fmt: skip
    table = render(rows)
    print(table)
    served = [r for r in rows if r["layer"] in ("bucket", "cache")]
    worst = min((r["served_vs_torch"] for r in served), default=None)
    summary = (
        f"{len(rows)} rows; {sum(r['layer'] == 'bucket' for r in rows)} GEMM rows served by the bucket layer; worst "
        f"served/torch speed among Triton-served rows: {worst if worst is None else round(worst, 3)}; "
        f"{sum(not r['correct'] for r in rows)} mismatches; tuning {tuned_s:.0f} s, total "
        f"{time.perf_counter() - t0:.0f} s; skipped by the budget: {len(skipped)} {skipped}"
    )
    print(summary)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "m_buckets.txt").write_text(table + "\n" + summary + "\n")
    record = {"device": device.label, "margin": buckets.BUCKET_MARGIN, "trials": opts.trials, "rows": rows,
              "skipped": skipped, "summary": summary}  # fmt: skip
    (opts.out / "m_buckets.json").write_text(json.dumps(record, indent=1, default=str))


def render(rows: list[dict[str, Any]]) -> str:
    head = f"{'shape':<22} {'M':>6} {'bucket':>13} {'edges/torch':>11} {'layer':>15} {'cfg ms':>8} {'torch ms':>8} " \
           f"{'torch/cfg':>9} {'served':>7}"  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        bucket = "-" if r["bucket"] is None else f"({r['bucket'][0]},{r['bucket'][1]})"
        lines.append(
            f"{r['shape']:<22} {r['m']:>6} {bucket:>13} {r['edges_vs_torch']:>11} {r['layer']:>15} "
            f"{r['config_ms']:>8.4f} {r['torch_ms']:>8.4f} {r['config_speedup']:>9.2f} {r['served_vs_torch']:>7.2f}"
            + ("" if r["correct"] else "  WRONG")
        )
    lines.append("torch/cfg: torch's time / the bucket config's at this M (> 1: the config is faster); served: torch's "
                 "time / the time of what dispatch serves for this M (1.00 where torch serves it)")  # fmt: skip
    lines += [f"  {r['shape']} M={r['m']}: {r['note']}" for r in rows if r["note"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
