#!/usr/bin/env bash
# Eleventh session: #5's two near misses, every sm90 regime of benchmarks/sweep.py (TMA
# wherever the variant takes it; the 192-row tiles were last swept with cp.async) on CogVideoX
# 10% (D=64, target 1.3x Flex) and the 128-row ones on HunyuanVideo 10% (target 1.4x).
set -uo pipefail
. benchmarks/device/common.sh
timeout 200 python3 benchmarks/sweep.py --shape cogvideox-5b --density 0.1 --only sm90 2>&1 | tee "$out/sweep_cog.txt"
timeout 200 python3 benchmarks/sweep.py --shape hunyuan-720p --density 0.1 --only sm90_128 2>&1 | tee "$out/sweep_hunyuan.txt"
