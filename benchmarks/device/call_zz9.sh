#!/usr/bin/env bash
# Tenth session: where HunyuanVideo's random 10% loses (1.32x Flex's kernel against Wan's 1.54x,
# call_zz3.sh): K/V of one head there is 60 MB, more than the L2, so the memory sections (L2 hit
# rate, DRAM throughput) next to Wan's 10%; then call_zz7.sh (the portable kernel next to FA2).
set -uo pipefail
. benchmarks/device/common.sh
for c in "0.1 hunyuan-720p" "0.1 wan-1.3b-480p"; do
  set -- $c
  timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats -k regex:bsa_fwd --launch-skip 2 --launch-count 1 \
    python3 benchmarks/ncu_one.py $1 $2 > "$out/ncu_mem_$2_$1.txt" 2>&1
  echo "ncu $2 $1 rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Hit Rate|L1/TEX Hit|Memory Throughput|Issue Slots Busy|No Eligible" "$out/ncu_mem_$2_$1.txt" | head -10
done
bash benchmarks/device/call_zz7.sh
