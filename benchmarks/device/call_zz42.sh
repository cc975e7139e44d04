#!/usr/bin/env bash
# Fourteenth session: where the portable kernel (sm80_128x64_w4_s2, forced on the H200) loses
# its last ~4.5% to FA2 on dense Wan -- ncu's warp-state sampling per SASS instruction of both
# kernels (FA2 = torch SDPA's flash backend), as call_zz37.sh did for the D=64 Hopper kernel.
set -uo pipefail
. benchmarks/device/common.sh
prof() {  # name kernel-regex command...
  local name=$1 k=$2; shift 2
  rep="$out/src_$name"
  timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section Occupancy --section LaunchStats -k "regex:$k" \
    --launch-skip 2 --launch-count 1 -o "$rep" "$@" > "$rep.log" 2>&1
  echo "== ncu $name rc=$?"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
  ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Registers Per|Shared Memory Config|Achieved Occ" \
    "$rep.details.txt"
  rm -f "$rep.ncu-rep"
}
prof portable_wan_dense bsa_fwd python3 benchmarks/ncu_one.py 1.0 wan-1.3b-480p \
  "sm80_128x64_w4_s2[combine_threshold=0.0]"
prof fa2_wan_dense flash_fwd python3 benchmarks/ncu_sdpa.py flash wan-1.3b-480p
