#!/usr/bin/env bash
# Fifth session: the stream tests (CuPy 14's Stream.from_external replaces ExternalStream), then
# a fresh sm90-only H200 regime table with plan time taken as the fastest of 12 timings (was the
# median of 5: 0.43-0.87 ms for one code path in call_v), and its held-out evaluation.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -W error::DeprecationWarning \
  -k "stream or torch or jax" > "$out/stream_tests.txt" 2>&1
echo "stream tests rc=$?: $(tail -1 $out/stream_tests.txt)"; grep -E "^E " "$out/stream_tests.txt" | head -5
s=$(date +%s)
timeout 370 python3 -m tessera profile --out "$out/nvidia-h200.json" --kernel-families sm90 \
  --budget-minutes 5.5 > "$out/profile.txt" 2>&1
echo "profile rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/profile.txt)"
if grep -q "(done)" "$out/profile.txt"; then
  timeout 165 python3 -m tessera profile --evaluate "$out/nvidia-h200.json" --kernel-families sm90 \
    --out "$out/eval.json" --budget-minutes 2.4 > "$out/eval.txt" 2>&1
  echo "evaluate rc=$?"; tail -3 "$out/eval.txt"
fi
