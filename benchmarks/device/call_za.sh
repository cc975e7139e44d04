#!/usr/bin/env bash
# Prepared for the next session (NOT yet run). First where a request's host time goes (#4's
# request target: cProfile of 200 requests per shape), then the H200 table at the models' own
# head counts (the 4-head table meets its held-out evaluation but its picks did not pay in
# full-size requests), one-sync mapping only (restricted merges never came within 5% of a
# request's best), and, if the profile finished, its held-out evaluation at the models' heads.
# If the profile stops on its budget: copy $OUT/nvidia-h200-model-heads.json into the tree
# (benchmarks/figures/) and run the profile line again with --resume --out on that copy.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 45 python3 benchmarks/request_profile.py --shape $s > "$out/request_profile_$s.txt" 2>&1
  echo "request profile $s rc=$?: $(tail -1 $out/request_profile_$s.txt)"
done
opts="--kernel-families sm90 --combine-thresholds 0 --heads model"
s=$(date +%s)
timeout 330 python3 -m tessera profile --out "$out/nvidia-h200-model-heads.json" $opts \
  --budget-minutes 5 > "$out/profile.txt" 2>&1
echo "profile rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/profile.txt)"
if grep -q "(done)" "$out/profile.txt"; then
  timeout 160 python3 -m tessera profile --evaluate "$out/nvidia-h200-model-heads.json" $opts \
    --out "$out/eval.json" --budget-minutes 2.3 > "$out/eval.txt" 2>&1
  echo "evaluate rc=$?"; tail -3 "$out/eval.txt"
fi
