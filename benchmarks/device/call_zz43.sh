#!/usr/bin/env bash
# Fourteenth session: the span's row restriction read before a step's cp.async copies are issued
# (bsa_sm80.cu; bsa_sm90.cu's plain variant -- the producer variants' SASS is unchanged),
# uncommitted when run. The whole GPU suite, memcheck on small portable and plain-sm90 cases,
# then kernel A/B against HEAD (435d362 in .ab/old: git archive HEAD tessera benchmarks | tar -x
# -C .ab/old), the order alternating by round.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
sanitize memcheck 100 "dtype_headdim_layout and bhld and bfloat16 and 128 and sm80"
sanitize memcheck 100 "packed_keys and 64-64-64-False"
p80="sm80_128x64_w4_s2[combine_threshold=0.0]"
p90="sm90_64x64_w4_s3[combine_threshold=0.0,pack_keys=True]"
one() {  # tree label shape regime args...
  local tree=$1 label=$2 shape=$3 reg=$4; shift 4
  PYTHONPATH=$tree timeout 60 python3 $tree/benchmarks/sweep.py --shape $shape "$@" \
    --regime "$reg" 2>&1 | tail -1 | sed "s|^|$label |" | tee -a "$out/ab_span.txt"
}
for round in 1 2; do
  for c in "wan-1.3b-480p $p80 --density 1.0" "wan-1.3b-480p $p80 --density 0.1" \
           "cogvideox-5b $p80 --density 0.1" "wan-1.3b-480p $p90 --family topk_pooled"; do
    if [ $round = 1 ]; then one "$PWD" new $c; one "$PWD/.ab/old" old $c
    else one "$PWD/.ab/old" old $c; one "$PWD" new $c; fi
  done
done
