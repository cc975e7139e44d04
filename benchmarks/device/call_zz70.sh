#!/usr/bin/env bash
# Seventeenth session: plan_scan back to call_zz68's form (call_zz69's contiguous shares were
# correct but slower: CogVideoX 56 -> 72 us). The whole GPU suite on the final tree.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
