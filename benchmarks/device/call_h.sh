#!/usr/bin/env bash
# Device call: sm90 with ordered warpgroup issue and the constant-stride K/V loads — a short
# correctness subset and the regime sweep.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -k "dtype_headdim or gqa or split or variable" > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -30
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--shape cogvideox-5b --density 1.0"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -6
done
