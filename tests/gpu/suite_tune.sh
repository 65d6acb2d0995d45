#!/usr/bin/env bash
# Tune the benchmark suite's problems on a 2-GPU machine (device tool kind nvidia-h200-x2) as two fleet workers
# sharing one journal queue, then export every result for cache/. With RECORD=1, before the workers start, GPU 0
# records the exhaustive LayerNorm 4096x4097 fp16 table (done once when the window variant changed that space).
# Queue order = worth when time is short (tests/gpu/suite_plan.py): bandwidth-bound memory rows, GEMM without
# epilogue and with bias+GELU, the other GEMM epilogues, launch-bound memory rows. Workers stop at CAP seconds;
# unfinished jobs stay queued and are listed. Knobs: CAP (default 420), MEM_TRIALS (6), GEMM_TRIALS (4), PLANS
# (which plan files, default all four; "gemm_main gemm_rest" re-tunes the GEMM suite only), RECORD (default 0).
set -u -o pipefail
FINAL=${OUT:-/tmp/out}; W=/tmp/suite_tune; rm -rf "$W"; mkdir -p "$W" "$FINAL"
export COLUMNS=200 PYTHONUNBUFFERED=1 TUNEKIT_CACHE_DIR="$W/cache" TRITON_CACHE_DIR="$W/triton"
CAP=${CAP:-420}
tk() { python3 -m tunekit.cli "$@"; }
nvidia-smi -L
begin=$(date +%s)
python3 tests/gpu/suite_plan.py "$W" || exit 1
url="$W/fleet.journal"
for plan in ${PLANS:-memory_large gemm_main gemm_rest memory_small}; do
  case $plan in gemm_*) trials=${GEMM_TRIALS:-4} ;; *) trials=${MEM_TRIALS:-6} ;; esac
  tk tune --plan "$W/$plan.jsonl" --submit --storage "$url" --trials "$trials" | tail -n 1
done
left() { echo $((CAP - ($(date +%s) - begin))); }
(
  if [ "${RECORD:-0}" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m tunekit.cli record --kernel layernorm -s 4096x4097 \
      --dtype float16 --workers 12 --out "$FINAL/layernorm_4097.json.gz" > "$FINAL/record.txt" 2>&1
    echo "record rc=$? at $(($(date +%s) - begin)) s"
  fi
  CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=16 timeout "$(left)" python3 -m tunekit.cli worker --storage "$url" \
    > "$FINAL/worker0.txt" 2>&1
  echo "worker 0 rc=$? at $(($(date +%s) - begin)) s"
) &
(
  CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=16 timeout "$(left)" python3 -m tunekit.cli worker --storage "$url" \
    > "$FINAL/worker1.txt" 2>&1
  echo "worker 1 rc=$? at $(($(date +%s) - begin)) s"
) &
wait
tk status --storage "$url" | tail -n 8
tk export --storage "$url" --out "$FINAL/tuned.json"
grep -h "phases" "$FINAL"/worker*.txt | cut -c1-250
[ -f "$FINAL/record.txt" ] && tail -n 15 "$FINAL/record.txt"
