#!/usr/bin/env bash
# Session 4: where the warp-specialized kernel's cycles go (ncu full set with SASS-level stall
# sampling on Wan dense) and where device planning's time goes (cProfile).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
python3 benchmarks/ncu_one.py 0.1 > /dev/null 2>&1  # compile outside the profiler
s=$(date +%s)
timeout 240 ncu --set full --import-source yes -k regex:bsa_fwd --launch-skip 2 --launch-count 1 \
  -o /tmp/ws python3 benchmarks/ncu_one.py 1.0 > "$out/ncu_full_log.txt" 2>&1
echo "ncu rc=$? $(( $(date +%s)-s ))s"
ncu --import /tmp/ws.ncu-rep --page source --csv --print-source sass > "$out/sass.csv" 2>&1; echo "sass rc=$? $(wc -c < $out/sass.csv)"
ncu --import /tmp/ws.ncu-rep --page details --print-details all > "$out/details.txt" 2>&1
grep -iE "stall|tensor|pipe" "$out/details.txt" | head -60
ncu --import /tmp/ws.ncu-rep --page raw --csv 2>/dev/null | python3 -c "
import csv,sys
r=list(csv.reader(sys.stdin)); h,u,v=r[0],r[1],r[2]
for a,b,c in zip(h,u,v):
  if any(x in a for x in ('issue_stalled','pipe_tensor','gmma','inst_executed_pipe')) and c not in ('','0'): print(a,b,c)
" > "$out/raw_stalls.txt" 2>&1; wc -l "$out/raw_stalls.txt"
timeout 90 python3 benchmarks/plan_speed.py --profile > "$out/plan_profile.txt" 2>&1; head -60 "$out/plan_profile.txt"
