#!/usr/bin/env bash
# Device call: GPU tests (incl. the two written blind), racecheck detail, GPU pytest-benchmark.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import cupy,torch; from tessera.cuda.loader import nvrtc_version; print('cupy',cupy.__version__,'torch',torch.__version__,'nvrtc',nvrtc_version())" | tee -a "$out/gpu.txt"
s=$(date +%s)
timeout 300 python3 -m pytest -q -m gpu tests -x -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"
grep -E "FAILED|Error" "$out/gpu_tests.txt" | head -20
s=$(date +%s)
timeout 150 compute-sanitizer --tool racecheck --racecheck-report all --print-level info \
  python3 -m pytest -q -p no:cacheprovider tests/test_attention_gpu.py -k "heavy_rows_split or variable_blocks" \
  > "$out/racecheck.txt" 2>&1
echo "racecheck rc=$? $(( $(date +%s)-s ))s"; grep -iE "hazard|warning|error|RACECHECK SUMMARY" "$out/racecheck.txt" | sort | uniq -c | head -20
s=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_gpu.py --benchmark-enable \
  --benchmark-json="$out/bench_gpu.json" --benchmark-max-time=0.3 --benchmark-min-rounds=5 \
  --benchmark-columns=median,rounds --benchmark-sort=name > "$out/bench_gpu.txt" 2>&1
echo "bench_gpu rc=$? $(( $(date +%s)-s ))s"; tail -45 "$out/bench_gpu.txt"
