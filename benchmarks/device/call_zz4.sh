#!/usr/bin/env bash
# Ninth session, main with the TMA producer: where the time goes (ncu) on Wan dense and 10% and
# CogVideoX 10% (D=64), the evidence #5 asks for against the 788 TFLOP/s matmul peak.
set -uo pipefail
. benchmarks/device/common.sh
for c in "1.0 wan-1.3b-480p" "0.1 wan-1.3b-480p" "0.1 cogvideox-5b"; do
  set -- $c
  timeout 100 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats -k regex:bsa_fwd \
    --launch-skip 2 --launch-count 1 python3 benchmarks/ncu_one.py $1 $2 > "$out/ncu_$2_$1.txt" 2>&1
  echo "ncu $2 $1 rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Tensor" "$out/ncu_$2_$1.txt" | head -8
done
