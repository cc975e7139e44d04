#!/usr/bin/env bash
# Fifth session (ran at 15ea1fe, figures in RESULTS.md): the persistent
# producer kernel that takes its next task as soon as the current task's copies are issued.
# Smoke test first (a deadlock would eat the budget), then an A/B of persistence on the same masks (--one-task-ctas launches
# the same kernel with one CTA per task, which is what main does), then the GPU suite,
# racecheck and memcheck on the persistent tests.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -x -k "persistent" > "$out/smoke.txt" 2>&1
ok=$?; echo "smoke rc=$ok $(( $(date +%s)-s ))s: $(tail -1 $out/smoke.txt)"; grep -E "^E |Error" "$out/smoke.txt" | head -8
[ $ok -ne 0 ] && exit 1
for a in "--density 0.1" "--density 1.0" "--shape cogvideox-5b --density 0.1" "--shape cogvideox-5b --density 1.0"; do
  for ab in "" "--one-task-ctas"; do
    echo "== $a $ab" >> "$out/sweep_ab.txt"
    timeout 40 python3 benchmarks/sweep.py $a --only w12 $ab 2>&1 | tee -a "$out/sweep_ab.txt" | head -2
  done
done
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent_ctas and 3 and 128" > "$out/sanitizer.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent" >> "$out/sanitizer.txt" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
