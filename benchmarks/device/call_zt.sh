#!/usr/bin/env bash
# Prepared in the seventh session, run in the eighth: it HUNG (the producer warpgroup's 64 registers overdrew the launch pool, see RESULTS "eighth session"); call_zu.sh is the fixed rerun.
# one call that checks and measures both. Before running, unpack main's package beside the
# checkout (untracked, not committed):
#   rm -rf ab_main && mkdir ab_main && git archive main tessera | tar -x -C ab_main
# 1. the GPU suite (the packed-key tests included) and the sanitizers;
# 2. kernel times of main against this branch, alternating in one machine session (the overlap
#    of softmax and P V at head dims 64/96 and with 64-key steps);
# 3. the packed key walk on the top-k cubes and sliding tiles (sweep; `pack_keys=True` names).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
sanitize racecheck 90 "persistent_ctas and 3 and 128"
sanitize memcheck 150 "persistent or packed_keys"
for i in 1 2; do
  for t in ab_main $PWD; do
    for s in "cogvideox-5b 0.1 sm90_128x128_w12_s3" "cogvideox-5b 1.0 sm90_128x128_w12_s3" \
             "wan-1.3b-480p 0.1 sm90_128x128_w12_s3" "wan-1.3b-480p 0.1 sm90_128x64_w12_s4"; do
      set -- $s
      PYTHONPATH=$t timeout 60 python3 benchmarks/sweep.py --shape $1 --density $2 --only $3 2>&1 \
        | tail -1 | sed "s|^|$(basename $t) |"
    done
  done
done | tee "$out/ab_sweep.txt"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 120 python3 benchmarks/sweep.py --shape $s --family topk_pooled --only sm90_ 2>&1 \
    | tee -a "$out/sweep_packed.txt" | head -6
done
