#!/usr/bin/env bash
# Device call: device-planner tests (CSR masks now scattered to dense), planning cost per family,
# then the regime profile (written under $OUT; commit it to tables/ afterwards).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py \
  -k "device_planner or side_stream or variable or restricted or heavy" > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"
grep -E "^FAILED|Error" "$out/gpu_tests.txt" | head -10
s=$(date +%s)
timeout 100 python3 benchmarks/plan_families.py --profile > "$out/plan_families.txt" 2>&1
echo "plan_families rc=$? $(( $(date +%s)-s ))s"; grep -E "^(wan|cog|hun|shape)" "$out/plan_families.txt"
s=$(date +%s)
timeout 400 python3 -m tessera profile --out "$out/nvidia-h200.json" --budget-minutes ${BUDGET:-5.5} \
  > "$out/profile.txt" 2> "$out/profile_log.txt"
echo "profile rc=$? $(( $(date +%s)-s ))s"; tail -3 "$out/profile.txt"; tail -4 "$out/profile_log.txt" | tr '\r' '\n' | tail -4
