#!/usr/bin/env bash
# Fifteenth session: the scale check and the new GPU test of an explicit softmax scale (0.02 and
# 0.3, every family), with the layout/dtype/head-dim matrix and the validation test.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests/test_attention_gpu.py \
  -k "explicit_scale or validation or dtype_headdim_layout or two_64_row"
