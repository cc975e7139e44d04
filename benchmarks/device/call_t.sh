#!/usr/bin/env bash
# Session 4, final state (one task per CTA, producer variant default, SM-aware split rule):
# the default-regime GPU tests and the bench against the baselines at this commit.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -k "default or sm90ws or refused" > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?: $(tail -1 $out/gpu_tests.txt)"
timeout 100 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --family all \
  --reps 10 --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2>/dev/null; echo "bench rc=$?"; cat "$out/bench.txt"
