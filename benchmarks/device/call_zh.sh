#!/usr/bin/env bash
# Sixth session, final check: the GPU suite with regime tables on by default, and `info`.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 170 tests --maxfail=20
timeout 30 python3 -m tessera info 2>&1 | tee "$out/info.txt" | grep -i -A1 "table"
