#!/usr/bin/env bash
# Session 4: descriptor offsets + tree reductions — GPU suite, then the sweep on the same masks
# as call_m (before: Wan 10% 1.549 ms, dense 13.57, CogVideoX 10% 1.458, top-k 64x64 2.74-2.94).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--family topk_pooled"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -4
done
