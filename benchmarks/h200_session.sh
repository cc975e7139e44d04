#!/usr/bin/env bash
# One device call's worth of checks and timings (the device tool's machine has torch, JAX,
# CuPy and compute-sanitizer). Usage there: bash benchmarks/h200_session.sh "$OUT"
set -uo pipefail
out=${1:-/tmp/tessera_out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tessera_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
timeout 240 python3 -m pytest -q -m gpu tests > "$out/gpu_tests.txt" 2>&1
tail -1 "$out/gpu_tests.txt"
timeout 240 python3 -m tessera demo > "$out/demo.txt" 2>&1
cat "$out/demo.txt"
timeout 420 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b \
  --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2> "$out/bench_err.txt"
cat "$out/bench.txt"
