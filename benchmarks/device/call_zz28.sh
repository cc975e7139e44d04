#!/usr/bin/env bash
# Twelfth session: CARRY (bsa_sm90.cu, TMA producer at head dim 64): a task's last P V issued
# with the next task's first S, its epilogue after that S. The GPU suite, memcheck and
# racecheck on the persistent tests at head dim 64, then a kernel A/B against the file before
# the change (.ab/bsa_sm90_base.cu, untracked) on CogVideoX, default regime.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
sanitize memcheck 90 "persistent_ctas and 64"
sanitize racecheck 90 "persistent_ctas and 64 and 3"
mkdir -p /tmp/ab_base && cp -r tessera benchmarks /tmp/ab_base/ && cp .ab/bsa_sm90_base.cu /tmp/ab_base/tessera/cuda/bsa_sm90.cu
ab_sweep 2 "pack_keys|align" /tmp/ab_base "$PWD" -- "cogvideox-5b 0.1 sm90_128x128_w12_s3" \
  "cogvideox-5b 0.3 sm90_128x128_w12_s3" "cogvideox-5b 1.0 sm90_128x128_w12_s3" | tee "$out/ab_carry.txt"
