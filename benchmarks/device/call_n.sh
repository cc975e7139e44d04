#!/usr/bin/env bash
# Session 4: the warp-specialized sm90 variant as the default — where its time goes (ncu on
# Wan dense and 10%), the bench against the baselines, the top-k sweep with a 64-row producer
# variant, and the demo.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
for dens in 1.0 0.1; do
  timeout 120 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats -k regex:bsa_fwd \
    --launch-skip 2 --launch-count 1 python3 benchmarks/ncu_one.py $dens > "$out/ncu_$dens.txt" 2>&1
  echo "ncu $dens rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Tensor|Registers Per" "$out/ncu_$dens.txt" | head -14
done
timeout 60 python3 benchmarks/sweep.py --family topk_pooled 2>&1 | tee "$out/sweep_topk.txt" | head -5
timeout 60 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; tail -5 "$out/demo.txt"
timeout 220 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --family all \
  --reps 10 --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench.txt"; tail -2 "$out/bench_err.txt"
