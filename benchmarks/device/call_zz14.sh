#!/usr/bin/env bash
# Tenth session: the portable kernel without per-row-tile predication of its mma.sync (ptxas
# bracketed each predicated pair with a WARPSYNC: 131 more instructions a 64-key step). The
# portable family's GPU tests and memcheck on a few, then kernel A/B against the kernel before
# (.ab/bsa_sm80_old.cu: the file at 299a719, a copy carried for this call only): dense and 10% Wan, 10% CogVideoX.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests sm80 70 tests/test_attention_gpu.py -k "sm80"
sanitize memcheck 40 "test_variable_blocks_and_empty_rows and sm80"
mkdir -p /tmp/e0 && cp -r tessera benchmarks /tmp/e0/ && cp .ab/bsa_sm80_old.cu /tmp/e0/tessera/cuda/bsa_sm80.cu
ab_sweep 1 "pack_keys|align" /tmp/e0 "$PWD" -- "wan-1.3b-480p 1.0 sm80_128x64_w4_s2" \
  "wan-1.3b-480p 0.1 sm80_128x64_w4_s2" "cogvideox-5b 0.1 sm80_64x64_w4_s2" | tee "$out/ab_sm80.txt"
ab_sweep 1 "pack_keys|align" /tmp/e0 "$PWD" -- "wan-1.3b-480p 1.0 sm80_128x64_w4_s2" | tee -a "$out/ab_sm80.txt"
