#!/usr/bin/env bash
# Prepared in the third session; the fourth ran call_m.sh instead (smoke test first): first run of the warp-specialized
# sm90 variant (GPU tests with the sm90ws parameters, racecheck on it, the sweep with the
# producer regimes), then the start of a fresh H200 regime table with both kernel families
# (resumable: run the profile line again with --resume until it reports done).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "(variable_blocks and sm90ws and 128) or (heavy_rows and sm90ws)" > "$out/racecheck_ws.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|passed|failed' $out/racecheck_ws.txt | tail -2 | tr '\n' ' ')"
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--family topk_pooled"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -4
done
timeout 300 python3 -m tessera profile --out "$out/nvidia-h200.json" --budget-minutes 4 > "$out/profile.txt" 2>&1
echo "profile rc=$?: $(tail -2 $out/profile.txt | tr '\n' ' ')"
