#!/usr/bin/env bash
# Session 4, after the SM-aware split rule: GPU suite, memcheck on the producer variant, ncu of
# the default (warp-specialized) kernel, planning per family, the masks that used to split,
# and sweep vs bench on the same random mask (their timings disagreed in call_n).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
s=$(date +%s)
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "(variable_blocks and sm90ws) or (heavy_rows and sm90ws) or (gqa and sm90ws and 4)" > "$out/memcheck_ws.txt" 2>&1
echo "memcheck rc=$? $(( $(date +%s)-s ))s: $(grep -E 'ERROR SUMMARY|passed|failed' $out/memcheck_ws.txt | tail -2 | tr '\n' ' ')"
for dens in 1.0 0.1; do
  timeout 90 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section LaunchStats --section MemoryWorkloadAnalysis -k regex:bsa_fwd \
    --launch-skip 2 --launch-count 1 python3 benchmarks/ncu_one.py $dens > "$out/ncu_$dens.txt" 2>&1
  echo "ncu $dens rc=$?"; grep -E "regime:|Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Block Size|Registers Per" "$out/ncu_$dens.txt" | head -10
done
timeout 120 python3 benchmarks/plan_families.py 2>&1 | tee "$out/plan_families.txt" | tail -30
timeout 40 python3 benchmarks/sweep.py --density 0.1 2>&1 | tee "$out/sweep_10.txt" | head -3
timeout 150 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10 --family topk_pooled,random_blocks \
  --reps 10 --json "$out/bench_split.json" > "$out/bench_split.txt" 2>/dev/null; echo "bench rc=$?"; cat "$out/bench_split.txt"
timeout 150 python3 -m tessera bench --shape hunyuan-720p --case random-10 --family sliding_tile,topk_pooled \
  --reps 3 --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2>/dev/null; echo "bench rc=$?"; cat "$out/bench_hunyuan.txt"
