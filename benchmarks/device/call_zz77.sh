#!/usr/bin/env bash
# Eighteenth session, final tree: #4/#5's bench on Wan and CogVideoX (every 128-block case) with
# kept plans, then the portable family forced (#4's request figure at 10%).
set -uo pipefail
. benchmarks/device/common.sh
request_bench 300 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --reps 10
mkdir -p "$out/default" && mv "$out"/bench* "$out/default/"
request_bench 200 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10 \
  --regime "sm80_128x64_w4_s2[combine_threshold=0.0]"
