#!/usr/bin/env bash
# Device call: planner tests after the merge-path change, demo, request profile, planning per family.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py \
  -k "device_planner or side_stream or restricted or variable or every_candidate_regime" > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head
timeout 60 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; cat "$out/demo.txt"
timeout 60 python3 benchmarks/request_profile.py > "$out/rp.txt" 2>&1; echo "rp rc=$?"; grep -E "request " "$out/rp.txt"
timeout 60 python3 benchmarks/plan_families.py > "$out/plan_families.txt" 2>&1; echo "pf rc=$?"; cat "$out/plan_families.txt"
