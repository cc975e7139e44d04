#!/usr/bin/env bash
# Nineteenth session: BlockMask.to_dense by a search of the CSR offsets (no read-back), the CSR
# device mask captured; the capture tests and memcheck; pytest-benchmark's captured-request
# rows next to the request and kernel rows (Wan, CogVideoX, HunyuanVideo; 4 heads).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_capture 300 tests/test_attention_gpu.py -k "captured_in_a_cuda_graph or cuda_graph or device_planner or csr"
sanitize memcheck 200 "captured_in_a_cuda_graph"
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu benchmarks/test_bench_gpu.py \
  --benchmark-enable --benchmark-min-rounds=5 --benchmark-max-time=0.5 \
  --benchmark-json="$out/bench_gpu.json" --benchmark-columns=median,rounds \
  --benchmark-sort=name > "$out/bench_gpu.txt" 2>&1
echo "bench_gpu rc=$?: $(tail -1 "$out/bench_gpu.txt")"
grep -E "^test_(request|captured_request|kernel)\[" "$out/bench_gpu.txt" | head -60
