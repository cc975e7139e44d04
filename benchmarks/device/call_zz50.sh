#!/usr/bin/env bash
# Fifteenth session: call_zz48's A/B of the unbranched softmax timed each run alone (sweep.py's
# old --burst 1: host launch work inside the figure, which varies between processes). Again,
# kernel-only (--burst 10, sweep.py of this tree for both): HEAD (043cfe1+) against aa23e50
# (.ab/old: git archive aa23e50 tessera benchmarks | tar -x -C .ab/old), alternating, two rounds.
set -uo pipefail
. benchmarks/device/common.sh
d="sm90_128x128_w12_s3[combine_threshold=0.0]"
one() {  # tree label shape args...
  local tree=$1 label=$2 shape=$3; shift 3
  PYTHONPATH=$tree timeout 60 python3 "$PWD/benchmarks/sweep.py" --shape $shape "$@" \
    2>&1 | tail -1 | sed "s|^|$label |" | tee -a "$out/ab_kernel.txt"
}
for round in 1 2; do
  for c in "cogvideox-5b --density 0.1" "cogvideox-5b --density 0.3" \
           "cogvideox-5b --density 1.0" "wan-1.3b-480p --density 0.1" \
           "wan-1.3b-480p --density 1.0"; do
    if [ $round = 1 ]; then one "$PWD" new $c --regime "$d"; one "$PWD/.ab/old" old $c --regime "$d"
    else one "$PWD/.ab/old" old $c --regime "$d"; one "$PWD" new $c --regime "$d"; fi
  done
done
