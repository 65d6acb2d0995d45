#!/usr/bin/env bash
# Issue 8 on a 2-GPU H200 machine: one job list tuned by 1 worker, then by 2 workers (`tunekit tune --plan
# --workers N`: one process per GPU, CUDA_VISIBLE_DEVICES set per worker, jobs in a sqlite store). Each run starts
# from an empty tunekit cache, an empty Triton cache and an empty store, so both compile and measure everything.
# Prints a table (wall time, jobs done, ratio to 1 worker) and compares the two runs' results: the random sampler
# with one seed measures the same configs in both, whatever the timings; the winners may differ only by noise.
# Knobs: TRIALS (default 6), SHAPES, KERNELS, DTYPE. Budget: under 8 minutes in all.
set -u -o pipefail
FINAL=${OUT:-/tmp/out}; W=/tmp/i8; rm -rf "$W"; mkdir -p "$W" "$FINAL"
export COLUMNS=250 PYTHONUNBUFFERED=1
TRIALS=${TRIALS:-6}
KERNELS=${KERNELS:-"layernorm rmsnorm softmax"}
SHAPES=${SHAPES:-"16384x1024 8192x2048 4096x4096 2048x8192"}
DTYPE=${DTYPE:-float16}
tk() { python3 -m tunekit.cli "$@"; }

nvidia-smi -L
args=(); for k in $KERNELS; do args+=(-k "$k"); done; for s in $SHAPES; do args+=(-s "$s"); done
tk plan "$W/plan.jsonl" "${args[@]}" --dtype "$DTYPE" || exit 1
tk plan "$W/plan.jsonl" | tail -n 1
# Untimed warm-up: the imports and each GPU's CUDA context once, so the first timed run pays no cold page cache.
for g in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
  CUDA_VISIBLE_DEVICES=$g python3 -c "import torch, triton, optuna, tunekit.kernels.layernorm, tunekit.kernels.rmsnorm, tunekit.kernels.softmax; torch.ones(1, device='cuda')"
done

declare -A wall
for n in 1 2; do
  run="$W/run$n"; mkdir -p "$run"
  export TUNEKIT_CACHE_DIR="$run/cache" TRITON_CACHE_DIR="$run/triton"
  echo "=== $n worker(s)"
  start=$(date +%s.%N)
  timeout $((n == 1 ? ${CAP1:-300} : ${CAP2:-200})) python3 -m tunekit.cli tune --plan "$W/plan.jsonl" --trials "$TRIALS" \
    --sampler random --seed 0 --workers "$n" > "$run/tune.txt" 2>&1
  echo "rc=$?"
  wall[$n]=$(python3 -c "print($(date +%s.%N) - $start)")
  grep -E "^worker|done in|failed|jobs queued|jobs on|^error" "$run/tune.txt" | cut -c1-160
  tk status --storage "sqlite:///$run/cache/fleet.db" | grep -E "│" | cut -c1-120
  tk export --storage "sqlite:///$run/cache/fleet.db" --out "$run/db.json"
done

echo "=== summary"
python3 - "$W" "${wall[1]}" "${wall[2]}" <<'EOF'
import json, sys
from pathlib import Path
w, t1, t2 = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
runs = {}
for n in (1, 2):
    path = w / f"run{n}" / "db.json"
    entries = json.loads(path.read_text())["entries"] if path.exists() else []
    runs[n] = {json.dumps(e["key"], sort_keys=True): e for e in entries}
planned = sum(1 for line in (w / "plan.jsonl").read_text().splitlines() if line.strip())
print("| workers | wall s | jobs done | time vs 1 worker |")
print("| --- | --- | --- | --- |")
for n, t in ((1, t1), (2, t2)):
    print(f"| {n} | {t:.1f} | {len(runs[n])}/{planned} | {t / t1:.3f} |")
common = sorted(set(runs[1]) & set(runs[2]))
def measured(e):
    return sorted((json.dumps(t["config"], sort_keys=True), t["status"]) for t in e["trials"])
same_trials = sum(measured(runs[1][k]) == measured(runs[2][k]) for k in common)
same_best = sum(runs[1][k]["best"]["config"] == runs[2][k]["best"]["config"] for k in common)
diffs = [abs(runs[1][k]["best"]["time_ms"] / runs[2][k]["best"]["time_ms"] - 1) for k in common]
print(f"results: {len(common)} jobs in both runs; same configs measured with the same verdicts: "
      f"{same_trials}/{len(common)}; same winner: {same_best}/{len(common)}; "
      f"best time max relative difference: {max(diffs, default=0):.1%}")
for k in common:
    a, b = runs[1][k], runs[2][k]
    if a["best"]["config"] != b["best"]["config"]:
        print(f"  winner differs for {a['key']['kernel']} {a['key']['problem']}: "
              f"{a['best']['config']} {a['best']['time_ms']:.4f} ms vs {b['best']['config']} {b['best']['time_ms']:.4f} ms")
EOF
tar czf "$FINAL/issue8.tgz" -C "$W" plan.jsonl run1/tune.txt run1/db.json run2/tune.txt run2/db.json 2>/dev/null
