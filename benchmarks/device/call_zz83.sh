#!/usr/bin/env bash
# Nineteenth session: Plan.run captured with capture memory (a task counter for a new stream);
# the replan+run capture test, the capture tests again, memcheck on them, then the whole suite.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_capture 300 tests/test_attention_gpu.py -k "captured_in_a_cuda_graph or cuda_graph"
sanitize memcheck 200 "captured_in_a_cuda_graph"
gpu_tests gpu_tests 400 tests --maxfail=20
