#!/usr/bin/env bash
# The whole benchmark suite on a 2-GPU machine (device tool kind nvidia-h200-x2), served by the shipped database
# only (an empty tunekit cache): GPU 0 runs the memory suite with torch.compile, GPU 1 the GEMM suite (torch eager
# and cuBLASLt's fused epilogues; torch.compile default mode is not one of issue 6's baselines and would double
# the run). Each writes its JSON after every row, so a run stopped at CAP seconds keeps what it measured.
# Knobs: CAP (default 500), SUITES (default "memory gemm"; "gemm" benches the GEMM suite alone, on GPU 1).
set -u -o pipefail
FINAL=${OUT:-/tmp/out}; W=/tmp/suite_bench; rm -rf "$W"; mkdir -p "$W" "$FINAL"
export COLUMNS=250 PYTHONUNBUFFERED=1 TUNEKIT_CACHE_DIR="$W/cache"
CAP=${CAP:-500}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
SUITES=${SUITES:-memory gemm}
case " $SUITES " in *" memory "*)
  CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR="$W/triton0" timeout "$CAP" python3 -m tunekit.cli bench --suite memory \
    --json "$FINAL/memory.json" --png "$FINAL/memory.png" > "$FINAL/memory.txt" 2>&1 & ;;
esac
case " $SUITES " in *" gemm "*)
  CUDA_VISIBLE_DEVICES=1 TRITON_CACHE_DIR="$W/triton1" timeout "$CAP" python3 -m tunekit.cli bench --suite gemm \
    --no-compile --json "$FINAL/gemm.json" --png "$FINAL/gemm.png" > "$FINAL/gemm.txt" 2>&1 & ;;
esac
wait
for f in $SUITES; do echo "=== $f"; sed -n '/^summary\|targets/,$p' "$FINAL/$f.txt" | tail -n 40; done
