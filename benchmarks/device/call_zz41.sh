#!/usr/bin/env bash
# Fourteenth session: a task's first chunk peeled off the consumers' loop at head dim 64
# (bsa_sm90.cu PEEL_FIRST: no P V with P = 0 per task), uncommitted when run. The whole GPU suite,
# memcheck/racecheck on the persistent D=64 tests, then kernel A/B against HEAD (435d362, put in
# .ab/old: git archive HEAD tessera benchmarks | tar -x -C .ab/old), order alternating by round.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
sanitize memcheck 120 "persistent_ctas_run_many_tasks and 64 and 3"
sanitize racecheck 150 "persistent_ctas_run_many_tasks and 64 and 3"
base="sm90_128x128_w12_s3[combine_threshold=0.0]"
one() {  # one tree, one case
  local tree=$1 label=$2 shape=$3; shift 3
  PYTHONPATH=$tree timeout 40 python3 $tree/benchmarks/sweep.py --shape $shape "$@" \
    --regime "$base" 2>&1 | tail -1 | sed "s|^|$label |" | tee -a "$out/ab_peel.txt"
}
for round in 1 2 3; do
  for c in "cogvideox-5b --density 0.1" "cogvideox-5b --density 0.3" \
           "cogvideox-5b --density 1.0" "cogvideox-5b --family spatial_temporal" \
           "wan-1.3b-480p --density 0.1"; do
    if [ $((round % 2)) = 1 ]; then one "$PWD" new $c; one "$PWD/.ab/old" old $c
    else one "$PWD/.ab/old" old $c; one "$PWD" new $c; fi
  done
done
