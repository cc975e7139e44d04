#!/usr/bin/env bash
# Seventeenth session: (1) where plan_scan's remaining time goes (ncu per-SASS samples,
# CogVideoX: 71 us without cache flush in call_zz65); (2) the request A/B of call_zz65 again
# with both trees as git-archive copies (call_zz65's symlinked new tree printed nothing) and
# full logs.
set -uo pipefail
. benchmarks/device/common.sh
rep="$out/ncu_plan_scan_cog"
timeout 150 ncu --cache-control none --clock-control none --section SourceCounters \
  --section WarpStateStats --section SpeedOfLight -k regex:plan_scan --launch-skip 3 \
  --launch-count 1 -o "$rep" python3 benchmarks/request_kernels.py --shape cogvideox-5b \
  --warm 3 > "$rep.log" 2>&1
echo "== ncu rc=$?"
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
gzip -f "$rep.csv"
ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
rm -f "$rep.ncu-rep"
grep -E "Duration|Warp Cycles Per Issued|Issue Slots" "$rep.details.txt" | head -5
python3 benchmarks/ncu_source.py "$rep.csv.gz" --top 12 | head -30
mkdir -p .ab/old .ab/new
git archive b5f099b tessera benchmarks tables | tar -x -C .ab/old
git ls-files -z tessera benchmarks tables | xargs -0 tar -c | tar -x -C .ab/new
cp benchmarks/request_kernels.py .ab/old/benchmarks/
for round in 1 2 3; do
  for t in .ab/old .ab/new; do
    for s in wan-1.3b-480p cogvideox-5b; do
      log="$out/ab_$(basename $t)_${s}_$round.txt"
      PYTHONPATH=$t TESSERA_CACHE_DIR=/tmp/tc_$(basename $t) timeout 120 python3 \
        $t/benchmarks/request_hotspots.py --shape $s --what request --n 50 --top 1 > "$log" 2>&1
      echo "$(basename $t) rc=$? $(tail -1 "$log")"
    done
  done
done
rm -rf .ab
