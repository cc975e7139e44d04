#!/usr/bin/env bash
# (Ran the persistent kernel of commit 2dc2450, since reverted: see RESULTS.md.)
# Session 4, last call: the persistent kernel with a global task counter — smoke test, GPU
# suite, racecheck/memcheck on the persistent tests, the Wan sweep, then the bench against the
# baselines and the demo at this commit.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py -x -k "persistent" > "$out/smoke.txt" 2>&1
ok=$?; echo "smoke rc=$ok $(( $(date +%s)-s ))s: $(tail -1 $out/smoke.txt)"; grep -E "^E |Error" "$out/smoke.txt" | head -8
[ $ok -ne 0 ] && exit 1
s=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent and 3 and 128" > "$out/sanitizer.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent" >> "$out/sanitizer.txt" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
for a in "--density 0.1" "--density 1.0"; do
  timeout 40 python3 benchmarks/sweep.py $a 2>&1 | tee -a "$out/sweep.txt" | head -3
done
timeout 40 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; tail -4 "$out/demo.txt"
timeout 200 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --family all \
  --reps 10 --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2>/dev/null; echo "bench rc=$?"; cat "$out/bench.txt"
