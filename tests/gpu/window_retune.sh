#!/usr/bin/env bash
# After a change to the row kernels (LayerNorm, RMSNorm, softmax), on a 2-GPU machine (nvidia-h200-x2): re-record
# the LayerNorm 4096x4097 fp16 timing table (GPU 0), re-tune the suite's problems of those three kernels with two
# fleet workers, export them for cache/, then the memory suite served by those results (GPU 0) while GPU 1 runs
# the unaligned-K GEMM experiment (tests/gpu/gemm_unaligned_k.py) and records an exhaustive LayerNorm-backward
# table (8192x4096 fp16). Knobs: TUNE_CAP (default 150 s), BENCH_CAP (250 s), TRIALS (6).
set -u -o pipefail
FINAL=${OUT:-/tmp/out}; W=/tmp/window_retune; rm -rf "$W"; mkdir -p "$W" "$FINAL"
export COLUMNS=250 PYTHONUNBUFFERED=1 TUNEKIT_CACHE_DIR="$W/cache"
tk() { python3 -m tunekit.cli "$@"; }
begin=$(date +%s); at() { echo "$1 at $(($(date +%s) - begin)) s"; }
python3 tests/gpu/suite_plan.py "$W" > /dev/null || exit 1
cat "$W/memory_large.jsonl" "$W/memory_small.jsonl" | grep -E '"kernel": "(layernorm|rmsnorm|softmax)"' > "$W/rows.jsonl"
url="$W/fleet.journal"
tk tune --plan "$W/rows.jsonl" --submit --storage "$url" --trials "${TRIALS:-6}" | tail -n 1
(
  CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR="$W/t0" timeout 90 python3 -m tunekit.cli record --kernel layernorm \
    -s 4096x4097 --dtype float16 --workers 12 --out "$FINAL/layernorm_4097.json.gz" > "$FINAL/record_ln.txt" 2>&1
  at "record rc=$?"
  CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR="$W/t0" OMP_NUM_THREADS=16 timeout $((${TUNE_CAP:-150} - 60)) \
    python3 -m tunekit.cli worker --storage "$url" > "$FINAL/worker0.txt" 2>&1
  at "worker 0 rc=$?"
) &
CUDA_VISIBLE_DEVICES=1 TRITON_CACHE_DIR="$W/t1" OMP_NUM_THREADS=16 timeout "${TUNE_CAP:-150}" \
  python3 -m tunekit.cli worker --storage "$url" > "$FINAL/worker1.txt" 2>&1
at "worker 1 rc=$?"
wait
tk status --storage "$url" | grep "│"
tk export --storage "$url" --out "$FINAL/tuned_rows.json"
CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR="$W/t0" timeout "${BENCH_CAP:-250}" python3 -m tunekit.cli bench \
  --suite memory --json "$FINAL/memory.json" --png "$FINAL/memory.png" > "$FINAL/memory.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 timeout 60 python3 tests/gpu/gemm_unaligned_k.py > "$FINAL/gemm_unaligned_k.txt" 2>&1
  at "gemm experiment rc=$?"
  CUDA_VISIBLE_DEVICES=1 TRITON_CACHE_DIR="$W/t1" timeout $((${BENCH_CAP:-250} - 80)) python3 -m tunekit.cli record \
    --kernel layernorm_backward -s 8192x4096 --dtype float16 --workers 12 \
    --out "$FINAL/layernorm_backward_8192x4096.json.gz" > "$FINAL/record_lnb.txt" 2>&1
  at "record backward rc=$?"
) &
wait
at "done"
cat "$FINAL/gemm_unaligned_k.txt"
tail -n 6 "$FINAL/record_ln.txt" "$FINAL/record_lnb.txt"
sed -n '/^targets/,$p' "$FINAL/memory.txt" | head -n 20
