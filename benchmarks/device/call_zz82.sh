#!/usr/bin/env bash
# Nineteenth session: the capture test with its free-memory fill (every free byte of CuPy's pool
# taken on the capture's stream, since CuPy's free chunks belong to the stream that freed them),
# protected and unprotected (benchmarks/capture_unprotected.py), plus memcheck.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_capture 300 tests/test_attention_gpu.py -k "captured_in_a_cuda_graph or cuda_graph"
timeout 200 python3 benchmarks/capture_unprotected.py > "$out/unprotected.txt" 2>&1
echo "unprotected probe rc=$?:"; grep unprotected "$out/unprotected.txt"
sanitize memcheck 200 "captured_in_a_cuda_graph"
