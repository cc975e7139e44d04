#!/usr/bin/env bash
# Sixteenth session (in place of call_zz54.sh, prepared last session, never run, removed).
# Tree = main with bsa_sm90.cu's softmax row flags lacking the redundant `tile_real` term
# (padding rows already fail `t0 < hi`, hi being clipped to the tile's end); .ab/old = 4f4441f
# (git archive).
# (1) The whole GPU suite at this state. (2) The README's main job, `python3 -m tessera demo`
# (its quoted output dates from 2026-11-29). (3) Kernel-only A/B of the row-flag change,
# alternating, two rounds, on the default variants (D=128 and 64, 128- and 64-row tiles). (4)
# Whether the 64x128 two-CTA variant still helps CogVideoX's masks after the unbranched
# softmax (call_zz47 measured it before). (5) ncu on Wan's top-k cubes (the default 64x64
# producer, two CTAs an SM): where the 64-token rate goes, beside call_zz51's 128-row figures.
# (6) The request's host phases now (request_phases.py).
set -uo pipefail
. benchmarks/device/common.sh
ln -sfn "$PWD" .ab/new
d="sm90_128x128_w12_s3[combine_threshold=0.0]"
ab_sweep 2 "^$" .ab/old .ab/new -- "wan-1.3b-480p 0.1 $d" "wan-1.3b-480p 1.0 $d" \
  "cogvideox-5b 0.1 $d" "cogvideox-5b 1.0 $d" \
  "wan-1.3b-480p family:topk_pooled sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]" \
  | tee "$out/ab_rowflags.txt"
gpu_tests gpu_tests 280 tests --maxfail=20
timeout 150 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; cat "$out/demo.txt"
new="sm90_64x128_w8_s3[combine_threshold=0.0]"
for round in 1 2; do
  if [ $round = 1 ]; then a=$d; b=$new; else a=$new; b=$d; fi
  for what in "--density 0.1" "--family spatial_temporal"; do
    timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b $what --regime "$a" \
      --regime "$b" 2>&1 | tail -2 | tee -a "$out/ab_64x128.txt"
  done
done
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
grep -E "Duration|Warp Cycles Per Issued|tensor_op|issue_active|Compute \(SM\)|Shared" \
  "$rep.details.txt" | head -20
python3 benchmarks/ncu_source.py "$rep.csv.gz" --top 12 | head -10
timeout 90 python3 benchmarks/request_phases.py --shape wan-1.3b-480p --n 200 \
  > "$out/phases_wan.txt" 2>&1; cat "$out/phases_wan.txt"
rm -f .ab/new
