#!/usr/bin/env bash
# Fifteenth session, at 043cfe1+: the variable-size families after the unbranched softmax --
# FlexAttention against Tessera on semantic clusters and radial masks (bench), and #5's
# variable-block target: the clusters' useful rate against random 128-token blocks at the same
# density (Wan 0.72, CogVideoX 0.84: the clusters' densities in earlier runs), kernel-only,
# default regimes (aligned tiles for the clusters, as select_regime takes them), two rounds.
set -uo pipefail
. benchmarks/device/common.sh
request_bench 240 --shape wan-1.3b-480p,cogvideox-5b --family semantic_clusters,radial --reps 5
al="sm90_128x128_w12_s3[combine_threshold=0.0,align_tiles=True]"
pl="sm90_128x128_w12_s3[combine_threshold=0.0]"
for round in 1 2; do
  for c in "wan-1.3b-480p 0.72" "cogvideox-5b 0.84"; do
    set -- $c
    timeout 90 python3 benchmarks/sweep.py --shape $1 --family semantic_clusters --regime "$al" \
      --regime "$pl" 2>&1 | tail -2 | tee -a "$out/clusters_rate.txt"
    timeout 60 python3 benchmarks/sweep.py --shape $1 --density $2 --regime "$pl" 2>&1 \
      | tail -1 | tee -a "$out/clusters_rate.txt"
  done
done
