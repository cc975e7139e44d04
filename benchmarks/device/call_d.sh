#!/usr/bin/env bash
# Device call: memcheck on the new paths (every candidate regime, CSR device masks), the demo
# with the H200 table in force, bench of HunyuanVideo's families, GPU pytest-benchmark again.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
  tests/test_attention_gpu.py -k "every_candidate_regime and (0 or 7 or 13 or 22) or device_planner" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$? $(( $(date +%s)-s ))s: $(grep -E 'ERROR SUMMARY|passed|failed' $out/memcheck.txt | tail -2 | tr '\n' ' ')"
s=$(date +%s)
timeout 100 python3 -m tessera demo > "$out/demo.txt" 2>&1
echo "demo rc=$? $(( $(date +%s)-s ))s"; cat "$out/demo.txt"
s=$(date +%s)
timeout 150 python3 -m tessera bench --shape hunyuan-720p --family sliding_tile,spatial_temporal,radial,topk_pooled,random_blocks \
  --reps 5 --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2> "$out/bench_hunyuan_err.txt"
echo "bench rc=$? $(( $(date +%s)-s ))s"; cat "$out/bench_hunyuan.txt"
s=$(date +%s)
timeout 110 python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_gpu.py --benchmark-enable \
  --benchmark-json="$out/bench_gpu.json" --benchmark-max-time=0.3 --benchmark-min-rounds=5 \
  --benchmark-columns=median --benchmark-sort=name > "$out/bench_gpu.txt" 2>&1
echo "bench_gpu rc=$? $(( $(date +%s)-s ))s"; grep -E "^test_" "$out/bench_gpu.txt" | head -40
