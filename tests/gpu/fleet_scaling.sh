#!/usr/bin/env bash
# Issue 8 on a 2-GPU H200 machine: one job list tuned by 1 worker, then by 2 workers (`tunekit tune --plan
# --workers N`: one process per GPU, CUDA_VISIBLE_DEVICES set per worker), for each job storage in STORAGE
# (sqlite: the queue and every job's tuning study in one sqlite file; journal: Optuna's journal file for the queue,
# tuning studies in memory). Each run starts from an empty tunekit cache, an empty Triton cache and an empty store,
# so every run compiles and measures everything. Each worker keeps one isolation process for all its jobs.
# Prints a table (wall time, jobs done, ratio to 1 worker), each worker's phases (where its seconds went: boot =
# interpreter and imports, open, claim, setup = isolation worker started or switched, measure, search = sampler and
# tuning study, cache, queue, idle) and compares the runs' results: the random sampler with one seed measures the
# same configs in every run, whatever the timings; the winners may differ only by noise.
# Knobs: TRIALS (default 30), SHAPES (8: with 3 kernels, 24 jobs), KERNELS, DTYPE, STORAGE ("sqlite", "journal" or
# both, default sqlite), WORKERS (default "1 2"), CAP1/CAP2 (seconds allowed per run of 1 / of more workers).
# Budget with the defaults: about 7 minutes; each extra storage in STORAGE adds as much again.
set -u -o pipefail
FINAL=${OUT:-/tmp/out}; W=/tmp/i8; rm -rf "$W"; mkdir -p "$W" "$FINAL"
export COLUMNS=250 PYTHONUNBUFFERED=1
TRIALS=${TRIALS:-30}
KERNELS=${KERNELS:-"layernorm rmsnorm softmax"}
SHAPES=${SHAPES:-"16384x1024 8192x2048 4096x4096 2048x8192 32768x512 8192x1024 4096x2048 2048x4096"}
DTYPE=${DTYPE:-float16}
STORAGE=${STORAGE:-sqlite}
WORKERS=${WORKERS:-"1 2"}
tk() { python3 -m tunekit.cli "$@"; }

nvidia-smi -L
args=(); for k in $KERNELS; do args+=(-k "$k"); done; for s in $SHAPES; do args+=(-s "$s"); done
tk plan "$W/plan.jsonl" "${args[@]}" --dtype "$DTYPE" || exit 1
tk plan "$W/plan.jsonl" | tail -n 1
# Untimed warm-up: the imports and each GPU's CUDA context once, so the first timed run pays no cold page cache.
for g in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
  CUDA_VISIBLE_DEVICES=$g python3 -c "import torch, triton, optuna, tunekit.kernels.layernorm, tunekit.kernels.rmsnorm, tunekit.kernels.softmax; torch.ones(1, device='cuda')"
done

runs=()
for kind in $STORAGE; do
  for n in $WORKERS; do
    name="$kind-$n"; run="$W/$name"; mkdir -p "$run"
    case $kind in
      sqlite) url="sqlite:///$run/fleet.db" ;;
      journal) url="$run/fleet.journal" ;;
      *) echo "STORAGE: unknown kind $kind (sqlite or journal)"; exit 1 ;;
    esac
    export TUNEKIT_CACHE_DIR="$run/cache" TRITON_CACHE_DIR="$run/triton"
    echo "=== $n worker(s), $kind"
    start=$(date +%s.%N)
    timeout $((n == 1 ? ${CAP1:-330} : ${CAP2:-210})) python3 -m tunekit.cli tune --plan "$W/plan.jsonl" \
      --trials "$TRIALS" --sampler random --seed 0 --workers "$n" --storage "$url" > "$run/tune.txt" 2>&1
    echo "rc=$?"
    python3 -c "print($(date +%s.%N) - $start)" > "$run/wall"
    grep -E "^worker .*(done,|CUDA)|^error" "$run/tune.txt" | cut -c1-200
    grep -E "done in|failed" "$run/tune.txt" | head -n 6 | cut -c1-220
    tk status --storage "$url" | grep -E "│" | cut -c1-120
    tk export --storage "$url" --out "$run/db.json"
    runs+=("$name")
  done
done

echo "=== summary"
python3 - "$W" "${runs[@]}" <<'EOF'
import json, re, sys
from pathlib import Path
w, names = Path(sys.argv[1]), sys.argv[2:]
planned = sum(1 for line in (w / "plan.jsonl").read_text().splitlines() if line.strip())
runs, walls = {}, {}
for name in names:
    path = w / name / "db.json"
    entries = json.loads(path.read_text())["entries"] if path.exists() else []
    runs[name] = {json.dumps(e["key"], sort_keys=True): e for e in entries}
    walls[name] = float((w / name / "wall").read_text())
print("| run | wall s | jobs done | time vs 1 worker, same storage |")
print("| --- | --- | --- | --- |")
for name in names:
    kind = name.rsplit("-", 1)[0]
    base = walls.get(f"{kind}-1")
    print(f"| {name} | {walls[name]:.1f} | {len(runs[name])}/{planned} | {walls[name] / base:.3f} |" if base else
          f"| {name} | {walls[name]:.1f} | {len(runs[name])}/{planned} | - |")

# Each worker's last lines: "worker ME: queue ..., CUDA_VISIBLE_DEVICES=G" first, "worker ME: phases (s) {...}" last.
job_phases = ["claim", "startup", "compile", "verify", "bench", "torch", "store", "other", "queue"]
cols = ["jobs", "boot", "open", *job_phases, "idle", "wall", "bench_started"]
print("\nper-worker phases (s): boot = process start to work(); startup = isolation worker started or switched, inputs")
print("| run | gpu | " + " | ".join(cols) + " | per job |")
print("| --- | --- | " + " | ".join("---" for _ in cols) + " | --- |")
notes = []
for name in names:
    text = (w / name / "tune.txt").read_text(errors="replace")
    gpus = dict(re.findall(r"^worker (.*?): queue .*CUDA_VISIBLE_DEVICES=(\S+)", text, re.M))
    worker_walls = [0.0]
    for me, data in re.findall(r"^worker (.*?): phases \(s\) (\{.*\})$", text, re.M):
        p = json.loads(data)
        worker_walls.append(p["wall"])
        per_job = sum(p.get(k, 0) for k in job_phases) / max(p["jobs"], 1)
        print(f"| {name} | {gpus.get(me, '?')} | " + " | ".join(f"{p.get(c, 0):g}" for c in cols) + f" | {per_job:.2f} |")
    done = [float(x) for x in re.findall(r": done in ([\d.]+) s", text)]
    if done:
        notes.append(f"{name}: {len(done)} jobs, 'done in' mean {sum(done) / len(done):.2f} s, max {max(done):.1f} s; "
                     f"outside the workers (tunekit tune: start, submit, results) {walls[name] - max(worker_walls):.1f} s")
print("\n".join(notes))

first = names[0]
for name in names[1:]:
    common = sorted(set(runs[first]) & set(runs[name]))
    def measured(e):
        return sorted((json.dumps(t["config"], sort_keys=True), t["status"]) for t in e["trials"])
    same_trials = sum(measured(runs[first][k]) == measured(runs[name][k]) for k in common)
    same_best = sum(runs[first][k]["best"]["config"] == runs[name][k]["best"]["config"] for k in common)
    diffs = [abs(runs[first][k]["best"]["time_ms"] / runs[name][k]["best"]["time_ms"] - 1) for k in common]
    print(f"\nresults {first} vs {name}: {len(common)} jobs in both; same configs measured with the same verdicts: "
          f"{same_trials}/{len(common)}; same winner: {same_best}/{len(common)}; "
          f"best time max relative difference: {max(diffs, default=0):.1%}")
    for k in common:
        a, b = runs[first][k], runs[name][k]
        if a["best"]["config"] != b["best"]["config"]:
            print(f"  winner differs for {a['key']['kernel']} {a['key']['problem']}: {a['best']['config']} "
                  f"{a['best']['time_ms']:.4f} ms vs {b['best']['config']} {b['best']['time_ms']:.4f} ms")
EOF
(cd "$W" && tar czf "$FINAL/issue8.tgz" plan.jsonl */tune.txt */db.json */wall 2>/dev/null)
