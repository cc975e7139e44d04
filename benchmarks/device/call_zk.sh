#!/usr/bin/env bash
# Seventh session: exponentials moved to the FMA pipe (common.cuh exp2_poly) -- every N-th key
# octet, N in 8, 4, 3, 2 -- timed against none on CogVideoX (D=64) and Wan (D=128); and where the
# D=64 kernel's warps stall (ncu stall reasons and pipe use, default regime, random 10%).
# Ran against a change since reverted (exp2_poly in common.cuh, a --exp2-poly flag in sweep.py:
# no gain, benchmarks/RESULTS.md); kept as the record of what ran, it does not run at HEAD.
set -uo pipefail
. benchmarks/device/common.sh
for dens in 0.1 1.0; do
  timeout 120 python3 benchmarks/sweep.py --shape cogvideox-5b --density $dens --only sm90_128x128_w12_s3 --exp2-poly 0,8,4,3,2 2>&1 | tee "$out/poly_cogvideox_$dens.txt"
done
timeout 60 python3 benchmarks/sweep.py --shape cogvideox-5b --density 0.1 --only sm90_64x64_w4_s3 --exp2-poly 0,8,4,2 2>&1 | tee "$out/poly_cogvideox_64_0.1.txt"
timeout 120 python3 benchmarks/sweep.py --shape wan-1.3b-480p --density 0.1 --only sm90_128x128_w12_s3 --exp2-poly 0,8,4,2 2>&1 | tee "$out/poly_wan_0.1.txt"
timeout 150 ncu --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__inst_executed_pipe_.*avg.pct_of_peak_sustained_active,regex:sm__pipe_.*cycles_active.avg.pct_of_peak_sustained_active" \
  -k regex:bsa_fwd --launch-skip 2 --launch-count 1 python3 benchmarks/ncu_one.py 0.1 cogvideox-5b > "$out/ncu_stalls_cogvideox_0.1.txt" 2>&1
echo "ncu rc=$?"; grep -E "stalled|pipe" "$out/ncu_stalls_cogvideox_0.1.txt" | awk '$NF+0 > 0.05' | head -60
