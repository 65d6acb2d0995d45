#!/usr/bin/env bash
# Issue 3 on the H200: tune every kernel on its default GPU shapes (small budget), then bench each (the bench's
# `correct` column re-checks the served config against the reference at the spec's tolerance table).
set -u -o pipefail
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
export TUNEKIT_CACHE_DIR=/tmp/tk COLUMNS=250 PYTHONUNBUFFERED=1
kernels=${KERNELS:-"layernorm_backward rmsnorm rmsnorm_backward reduction softmax gemm"}
trials=${TRIALS:-8}
for k in $kernels; do
  echo "=== $k"
  start=$(date +%s)
  tunekit tune --kernel "$k" --trials "$trials" > "$OUT/tune_$k.txt" 2>&1; rc=$?
  echo "tune $k rc=$rc wall=$(( $(date +%s) - start )) s"
  tail -n 30 "$OUT/tune_$k.txt" | grep -E "│|error" | cut -c1-200
  tunekit bench --kernel "$k" --json "$OUT/bench_$k.json" > "$OUT/bench_$k.txt" 2>&1; echo "bench $k rc=$?"
done
tunekit export --out "$OUT/issue3-h200.json" --device current
echo "=== summary (problem | served by | correct)"
for k in $kernels; do grep -hE "│" "$OUT/bench_$k.txt" | awk -F'│' -v k="$k" '{print k " |" $2 "|" $3 "|" $9}'; done
cp "$OUT/issue3-h200.json" "$FINAL/"; tar czf "$FINAL/issue3.tgz" -C /tmp o
