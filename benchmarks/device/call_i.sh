#!/usr/bin/env bash
# Device call: sm90 with key packing — every GPU test, compute-sanitizer (memcheck, racecheck)
# on a small sm90 suite, the regime sweep (random, dense, top-k), bench with the families.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
sel='(variable_blocks and sm90) or (heavy_rows and sm90) or (gqa and sm90 and 4-one) or (restricted and sm90)'
for tool in memcheck racecheck; do
  s=$(date +%s)
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -k "$sel" > "$out/sanitizer_$tool.txt" 2>&1
  echo "$tool rc=$? $(( $(date +%s)-s ))s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' $out/sanitizer_$tool.txt | tail -3 | tr '\n' ' ')"
done
for a in "--density 0.1" "--density 0.3" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--family topk_pooled" "--shape cogvideox-5b --family topk_pooled"; do
  timeout 90 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -5
done
timeout 200 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --family sliding_tile,spatial_temporal,radial,topk_pooled \
  --reps 10 --json "$out/bench.json" > "$out/bench.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench.txt"; tail -2 "$out/bench_err.txt"
