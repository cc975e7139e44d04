#!/usr/bin/env bash
# (Ran the persistent kernel of commits 481e447/2dc2450, since reverted: see RESULTS.md.)
# Session 4: the persistent warp-specialized kernel (CTAs run task sequences; the stage ring and
# the Q hand-over continue across tasks). Smoke test first (a deadlock would eat the budget),
# then the GPU suite, racecheck and memcheck on the persistent tests, and the sweep (before, at
# 4d2b1b5-ish: Wan 10% 1.54-1.61 ms, dense 13.51, CogVideoX 10% 1.452, top-k 64x64 2.66).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -x -k "persistent" > "$out/smoke.txt" 2>&1
ok=$?; echo "smoke rc=$ok $(( $(date +%s)-s ))s: $(tail -1 $out/smoke.txt)"; grep -E "^E |Error" "$out/smoke.txt" | head -8
[ $ok -ne 0 ] && exit 1
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent and 3" > "$out/racecheck.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|passed|failed' $out/racecheck.txt | tail -2 | tr '\n' ' ')"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent or (heavy_rows and sm90ws)" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' $out/memcheck.txt | tail -2 | tr '\n' ' ')"
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--family topk_pooled"; do
  timeout 60 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -3
done
