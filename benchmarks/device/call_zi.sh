#!/usr/bin/env bash
# Prepared for the next session (NOT yet run): where CogVideoX's D=64 kernel time goes, the one
# request target #4 still misses (1.36x FlexAttention at 10%; its kernel is 1.08x of Flex's).
# ncu on CogVideoX random 10% and dense with the default regime, then every sm90 variant on
# the same masks (kernel only).
set -uo pipefail
. benchmarks/device/common.sh
for dens in 0.1 1.0; do
  timeout 150 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats -k regex:bsa_fwd \
    --launch-skip 2 --launch-count 1 python3 benchmarks/ncu_one.py $dens cogvideox-5b > "$out/ncu_cogvideox_$dens.txt" 2>&1
  echo "ncu $dens rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Tensor|Registers Per" "$out/ncu_cogvideox_$dens.txt" | head -14
done
for dens in 0.1 1.0; do
  timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b --density $dens --only sm90 2>&1 | tee "$out/sweep_cogvideox_$dens.txt" | head -12
done
