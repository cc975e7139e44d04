#!/usr/bin/env bash
# Prepared in the eighth session, never run: superseded by the ninth session's benches
# (call_zz3.sh measured the request with this plan_scan: 0.25 ms). It was: the request bench
# on random-10
# (the bounds cache of 0a03232 in the bench's request) and the two families whose default
# changed (topk_pooled: the packed walk) or may change (semantic_clusters: aligned tiles).
# First an A/B of the request's phases: main before plan_scan's shared cost table (commit
# 6ec6eb8, unpacked beside the checkout, untracked:
#   rm -rf ab_scan && mkdir ab_scan && git archive 6ec6eb8 tessera benchmarks | tar -x -C ab_scan)
# against HEAD, alternating.
set -uo pipefail
. benchmarks/device/common.sh
for i in 1 2; do
  for t in ab_scan $PWD; do
    PYTHONPATH=$t timeout 45 python3 $t/benchmarks/request_phases.py --shape cogvideox-5b \
      --n 150 > "$out/phases_$(basename $t)_$i.txt" 2>&1
    echo "$(basename $t) run $i: $(tail -3 "$out/phases_$(basename $t)_$i.txt" | tr '\n' ' ')"
  done
done
request_bench 360 --shape wan-1.3b-480p,cogvideox-5b --case random-10 \
  --family topk_pooled,semantic_clusters --reps 10
# The clusters with aligned tiles, same run's baselines (out/bench.* are overwritten: keep both).
cp "$out/bench.txt" "$out/bench_default.txt"; cp "$out/bench.json" "$out/bench_default.json"
request_bench 200 --shape wan-1.3b-480p,cogvideox-5b --family semantic_clusters --reps 10 \
  --regime "sm90_128x128_w12_s3[combine_threshold=0.0,align_tiles=True]"
