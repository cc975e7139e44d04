#!/usr/bin/env bash
# Session 4, first call: smoke-test the warp-specialized sm90 variant alone (a deadlock would
# otherwise eat the whole test budget), then the full GPU suite (without sm90ws if the smoke
# test failed), racecheck on the producer variant, and the regime sweep.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
s=$(date +%s)
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -x \
  -k "sm90ws and (variable_blocks or heavy_rows or dtype_headdim)" > "$out/ws_smoke.txt" 2>&1
ws=$?; echo "ws smoke rc=$ws $(( $(date +%s)-s ))s: $(tail -1 $out/ws_smoke.txt)"
grep -E "^FAILED|Error|assert" "$out/ws_smoke.txt" | head -8
sel=""; [ $ws -ne 0 ] && sel="not sm90ws"
s=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 ${sel:+-k "$sel"} > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
if [ $ws -eq 0 ]; then
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "(variable_blocks and sm90ws and 128) or (heavy_rows and sm90ws)" > "$out/racecheck_ws.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|passed|failed' $out/racecheck_ws.txt | tail -2 | tr '\n' ' ')"
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--family topk_pooled"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -6
done
fi
