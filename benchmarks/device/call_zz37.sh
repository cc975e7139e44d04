#!/usr/bin/env bash
# Fourteenth session: where CogVideoX's D=64 kernel waits, instruction by instruction (ncu's
# warp-state sampling on the SASS), random 10% against dense, default regime. The consumer's
# per-chunk costs at 10% are ~40% above dense (ncu, seventh session); this says which
# instructions the stalls sit on.
set -uo pipefail
. benchmarks/device/common.sh
for c in "0.1 cogvideox-5b" "1.0 cogvideox-5b"; do
  set -- $c
  rep="$out/src_$2_$1"
  timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight -k regex:bsa_fwd --launch-skip 2 --launch-count 1 -o "$rep" \
    python3 benchmarks/ncu_one.py $1 $2 > "$rep.log" 2>&1
  echo "== ncu $2 $1 rc=$? $(grep -m1 regime: "$rep.log")"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err" \
    || ncu -i "$rep.ncu-rep" --page source --csv > "$rep.csv" 2>> "$rep.err"
  echo "csv lines $(wc -l < "$rep.csv") $(head -c 300 "$rep.err")"
  ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|No Eligible" "$rep.details.txt"
done
