#!/usr/bin/env bash
# Device call: sm90 with a prefetch distance of STAGES-2 and the one-sync planner handing splits
# to the task organization — GPU tests, racecheck + memcheck on sm90, sweep, planning per
# family, HunyuanVideo against the baselines.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
sel='device_planner_equals or (variable_blocks and sm90) or (heavy_rows and sm90) or (gqa and sm90 and 4-one) or (restricted and sm90)'
for tool in racecheck memcheck; do
  s=$(date +%s)
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -k "$sel" > "$out/$tool.txt" 2>&1
  echo "$tool rc=$? $(( $(date +%s)-s ))s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' $out/$tool.txt | tail -2 | tr '\n' ' ')"
done
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--shape cogvideox-5b --density 1.0" "--family topk_pooled"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -4
done
timeout 100 python3 benchmarks/plan_families.py 2>&1 | tee "$out/plan_families.txt"
timeout 150 python3 -m tessera bench --shape hunyuan-720p --case random-10,dense --family sliding_tile,topk_pooled \
  --reps 3 --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench_hunyuan.txt"; tail -2 "$out/bench_err.txt"
