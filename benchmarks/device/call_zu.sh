#!/usr/bin/env bash
# Eighth session: gpu-pending after the fix of its hang (call_zt.sh hung: the producer's 64
# registers plus two consumer warpgroups' 224 overdrew the 168 x 384 pool, so setmaxnreg.inc
# waited forever; now PRODUCER_REGS 56 and the consumers' share derived from the launch pool).
# Before running, unpack main beside the checkout (untracked, not committed):
#   rm -rf ab_main && mkdir ab_main && git archive main tessera benchmarks/sweep.py | tar -x -C ab_main
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -6
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize racecheck 60 "persistent_ctas and 3 and 128"
sanitize memcheck 80 "persistent or packed_keys"
for i in 1 2; do
  for t in ab_main $PWD; do
    for s in "cogvideox-5b 0.1 sm90_128x128_w12_s3" "cogvideox-5b 1.0 sm90_128x128_w12_s3" \
             "wan-1.3b-480p 0.1 sm90_128x64_w12_s4"; do
      set -- $s
      PYTHONPATH=$t timeout 40 python3 $t/benchmarks/sweep.py --shape $1 --density $2 --only $3 \
        2>&1 | tail -1 | sed "s|^|$(basename $t) $1 $2 |"
    done
  done
done | tee "$out/ab_sweep.txt"
timeout 70 python3 benchmarks/sweep.py --shape cogvideox-5b --family topk_pooled --only sm90_ 2>&1 \
  > "$out/sweep_packed.txt"; head -14 "$out/sweep_packed.txt"
