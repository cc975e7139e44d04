#!/usr/bin/env bash
# Fifteenth session, at 043cfe1+ (the unbranched softmax): where the default kernel's time goes
# now -- ncu's per-SASS warp-state sampling and instruction mix (as call_zz37 before the change)
# on CogVideoX random 10% (D=64) and Wan dense (D=128), with the tensor pipe's busy share.
set -uo pipefail
. benchmarks/device/common.sh
for c in "0.1 cogvideox-5b" "1.0 wan-1.3b-480p"; do
  set -- $c
  rep="$out/src_$2_$1"
  timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    -k regex:bsa_fwd --launch-skip 2 --launch-count 1 -o "$rep" \
    python3 benchmarks/ncu_one.py $1 $2 > "$rep.log" 2>&1
  echo "== ncu $2 $1 rc=$? $(grep -m1 regime: "$rep.log")"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
  gzip -f "$rep.csv"
  ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
  rm -f "$rep.ncu-rep"
  grep -E "Duration|Warp Cycles Per Issued|tensor_op|issue_active|Compute \(SM\)" "$rep.details.txt"
  python3 benchmarks/ncu_source.py "$rep.csv.gz" --top 12 | head -8
done
