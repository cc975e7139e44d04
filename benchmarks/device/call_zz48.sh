#!/usr/bin/env bash
# Fifteenth session: the sm90 consumers run every chunk's softmax, rows outside the span masked,
# instead of branching around it for warps with no row in the chunk (the branch made every
# iteration zero S's registers in advance: the chunk loop's SASS 749 -> 644 instructions at head
# dim 64, 805 -> 694 at 128), uncommitted when run. The whole GPU suite, then kernel A/B
# against HEAD (in .ab/old: git archive HEAD tessera benchmarks | tar -x -C .ab/old), the order
# alternating by round.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
cub="sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]"
one() {  # tree label shape args...
  local tree=$1 label=$2 shape=$3; shift 3
  PYTHONPATH=$tree timeout 60 python3 $tree/benchmarks/sweep.py --shape $shape "$@" \
    2>&1 | tail -1 | sed "s|^|$label |" | tee -a "$out/ab_softmax.txt"
}
d="sm90_128x128_w12_s3[combine_threshold=0.0]"
for round in 1 2; do
  for c in "cogvideox-5b --density 0.1" "cogvideox-5b --density 0.3" \
           "cogvideox-5b --density 1.0" "wan-1.3b-480p --density 0.1" \
           "wan-1.3b-480p --density 1.0"; do
    if [ $round = 1 ]; then one "$PWD" new $c --regime "$d"; one "$PWD/.ab/old" old $c --regime "$d"
    else one "$PWD/.ab/old" old $c --regime "$d"; one "$PWD" new $c --regime "$d"; fi
  done
  if [ $round = 1 ]; then t1="$PWD" l1=new t2="$PWD/.ab/old" l2=old
  else t1="$PWD/.ab/old" l1=old t2="$PWD" l2=new; fi
  one "$t1" $l1 wan-1.3b-480p --family topk_pooled --regime "$cub"
  one "$t2" $l2 wan-1.3b-480p --family topk_pooled --regime "$cub"
done
