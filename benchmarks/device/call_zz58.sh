#!/usr/bin/env bash
# Sixteenth session, at the packed gather of call_zz57 (committed): the whole GPU suite, and ncu
# on Wan's top-k cubes again (as call_zz55 before the change): where the 64-token rate goes now.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 280 tests --maxfail=20
rep="$out/src_wan_topk"
timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
  --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
  -k regex:bsa_fwd --launch-skip 2 --launch-count 1 -o "$rep" \
  python3 benchmarks/ncu_one.py topk_pooled wan-1.3b-480p > "$rep.log" 2>&1
echo "== ncu wan topk rc=$? $(grep -m1 regime: "$rep.log")"
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
gzip -f "$rep.csv"
ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
rm -f "$rep.ncu-rep"
grep -E "Duration|Warp Cycles Per Issued|tensor_op|issue_active|Compute \(SM\)|L2 Hit|Mem Pipes" \
  "$rep.details.txt" | head -20
python3 benchmarks/ncu_source.py "$rep.csv.gz" --top 16 | head -24
