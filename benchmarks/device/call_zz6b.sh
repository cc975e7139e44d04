#!/usr/bin/env bash
# Tenth session, after call_zz6.sh (split from it: one device call is limited to 600 s): the
# semantic clusters (and random blocks) with the plain default and with aligned tiles forced, one
# process each, against the baselines. The request with aligned tiles is now planned by the
# device kernels (was 14-15 ms by the general path, call_zz5.sh).
set -uo pipefail
. benchmarks/device/common.sh
aligned="sm90_128x128_w12_s3[combine_threshold=0.0,align_tiles=True]"
for regime in "" "$aligned"; do
  timeout 100 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b \
    --family semantic_clusters,random_blocks --reps 10 ${regime:+--regime "$regime"} \
    > "$out/bench_semantic_${regime:+aligned}.txt" 2>/dev/null
  echo "bench ${regime:-default} rc=$?"; cat "$out/bench_semantic_${regime:+aligned}.txt"
done
