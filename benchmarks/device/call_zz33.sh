#!/usr/bin/env bash
# Thirteenth session, ran on an uncommitted tree where the wide step was on for every TMA
# variant at head dim 64 (it became opt-in, Regime.wide_steps, after this run). The wide key
# step (bsa_sm90.cu TESSERA_WIDE_BN: the TMA variant at head dim 64 walks tasks of a few long
# spans 192 keys a step). call_zz32.sh measured fixed 192-key steps:
# dense CogVideoX 9.24-9.30 ms against 9.70-9.73 at 128, short spans much slower.
# 1. the GPU suite (every sm90 variant's loop moved into a per-width lambda); memcheck and
#    racecheck on the test that mixes both widths in one persistent launch;
# 2. kernel A/B against the tree before the change (.ab/old = git archive of a7da019; delete
#    after), alternating, two rounds: CogVideoX dense / 10% / sliding tile / spatial-temporal,
#    Wan 10% and dense (head dim 128: the refactor only) as the control;
# 3. the bench with cuDNN and Flex in one process on CogVideoX (dense, random 10%).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
sanitize memcheck 90 "wide_key_steps"
sanitize racecheck 120 "wide_key_steps and bfloat16"
reg="sm90_128x128_w12_s3"
ab_sweep 2 "pack_keys|align" "$PWD/.ab/old" "$PWD" -- "cogvideox-5b 1.0 $reg" \
  "cogvideox-5b 0.1 $reg" "cogvideox-5b family:sliding_tile $reg" \
  "cogvideox-5b family:spatial_temporal $reg" "wan-1.3b-480p 0.1 $reg" \
  "wan-1.3b-480p 1.0 $reg" | tee "$out/ab_wide.txt"
request_bench 150 --shape cogvideox-5b --case dense,random-10 --reps 10
