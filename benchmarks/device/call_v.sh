#!/usr/bin/env bash
# Fifth session (ran at 3fad90a, figures in RESULTS.md): a fresh H200 regime table over the sm90 family
# (--kernel-families sm90: the portable family lost on every mask swept on the H200, so its 24
# candidates are left out and the profile takes half the time), then its held-out evaluation.
# If the profile stops on its budget, copy $OUT/nvidia-h200.json to tables/, commit, and run the
# profile line again with --resume --out tables/nvidia-h200.json.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
timeout 330 python3 -m tessera profile --out "$out/nvidia-h200.json" --kernel-families sm90 \
  --budget-minutes 5 > "$out/profile.txt" 2>&1
echo "profile rc=$?: $(tail -1 $out/profile.txt)"
if grep -q "(done)" "$out/profile.txt"; then
  timeout 240 python3 -m tessera profile --evaluate "$out/nvidia-h200.json" --kernel-families sm90 \
    --out "$out/eval.json" --budget-minutes 3.5 > "$out/eval.txt" 2>&1
  echo "evaluate rc=$?"; tail -12 "$out/eval.txt"
fi
