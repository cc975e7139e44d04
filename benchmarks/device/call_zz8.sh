#!/usr/bin/env bash
# Tenth session, ran once (outputs: benchmarks/figures/s10_zz8_*); the change it measured was
# reverted (RESULTS.md, tenth session): no gain. Exponentials on the FMA pipe at head dim 64 (common.cuh fma_exp2, bsa_sm90.cu
# TESSERA_EXP2_FMA). At D=64 with 128-key steps a chunk's exponentials on the MUFU take as long
# as its two GEMMs; ncu (call_zz4.sh) had the tensor pipe 38.8% busy on CogVideoX.
# 1. correctness of the new default (a quarter of the octets on the FMA pipe at D=64): the
#    dtype/head-dim/layout tests at D=64, empty rows, the aligned default on a device mask;
# 2. kernel A/B, alternating: copies of this tree whose default moves 0, 4/16, 8/16 of the
#    octets (e0 = the kernel before this change), CogVideoX 10% and dense, Wan 10% at D=128
#    (unchanged: the default is 0 there) as a control.
set -uo pipefail
. benchmarks/device/common.sh
for k in 0 4 8; do
  mkdir -p /tmp/e$k && cp -r tessera benchmarks /tmp/e$k/
  sed -i "s|(TESSERA_D == 64 ? TESSERA_BN / 32 : 0)|(TESSERA_D == 64 ? TESSERA_BN * $k / 128 : 0)|" \
    /tmp/e$k/tessera/cuda/bsa_sm90.cu
  grep -c "TESSERA_BN \* $k / 128" /tmp/e$k/tessera/cuda/bsa_sm90.cu
done
gpu_tests d64 150 tests/test_attention_gpu.py -k \
  "(test_dtype_headdim_layout and 64) or empty_rows or aligned_tiles_chosen or tiling_pairs"
ab_sweep 2 "pack_keys|align" /tmp/e0 /tmp/e4 /tmp/e8 -- "cogvideox-5b 0.1 sm90_128x128_w12_s3" \
  "cogvideox-5b 1.0 sm90_128x128_w12_s3" | tee "$out/ab_exp2.txt"
ab_sweep 1 "pack_keys|align" /tmp/e0 /tmp/e4 -- "wan-1.3b-480p 0.1 sm90_128x128_w12_s3" \
  | tee -a "$out/ab_exp2.txt"
