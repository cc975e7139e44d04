#!/usr/bin/env bash
# Eighteenth session, on two H200s (kind nvidia-h200-x2): tensors on cuda:1 while cuda:0 is
# current (plan on the mask's device, kernels loaded per device, a host plan's queue copied per
# device, refusals of a mask or plan on the other GPU). The whole GPU suite, then memcheck on
# the two-GPU test.
set -uo pipefail
. benchmarks/device/common.sh
nvidia-smi -L
gpu_tests gpu_tests 400 tests --maxfail=20
sanitize memcheck 300 "second_gpu"
