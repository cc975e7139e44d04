#!/usr/bin/env bash
# Nineteenth session, final tree: #4/#5's request bench at random 10% with the default regimes
# (the headline figures, last measured in call_zz77) and the capture tests once more.
set -uo pipefail
. benchmarks/device/common.sh
request_bench 200 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10
gpu_tests gpu_capture 120 tests/test_attention_gpu.py -k "captured_in_a_cuda_graph"
