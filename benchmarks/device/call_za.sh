#!/usr/bin/env bash
# Prepared for the next session (NOT yet run). First where a request's host time goes (#4's
# request target: cProfile of 200 requests per shape), then the H200 table at the models' own
# head counts (the 4-head table meets its held-out evaluation but its picks did not pay in
# full-size requests), one-sync mapping only (restricted merges never came within 5% of a
# request's best), and, if the profile finished, its held-out evaluation at the models' heads.
# If the profile stops on its budget: copy $OUT/nvidia-h200-model-heads.json into the tree
# (benchmarks/figures/) and run profile_table again with --resume on that copy.
set -uo pipefail
. benchmarks/device/common.sh
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 45 python3 benchmarks/request_hotspots.py --shape $s > "$out/request_hotspots_$s.txt" 2>&1
  echo "request hotspots $s rc=$?: $(tail -1 $out/request_hotspots_$s.txt)"
done
opts=(--kernel-families sm90 --combine-thresholds 0 --heads model)
table="$out/nvidia-h200-model-heads.json"
profile_table "$table" 330 5 "${opts[@]}" && evaluate_table "$table" 160 2.3 "${opts[@]}"
