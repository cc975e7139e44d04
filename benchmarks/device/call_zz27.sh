#!/usr/bin/env bash
# Twelfth session: (1) HunyuanVideo random 10% against Flex again (1.40x in call_zz25: a second
# sample of the borderline ratio) and dense against cuDNN; (2) the 64-token cubes with deeper
# K/V rings in the 64-row producer variant (two CTAs an SM at head dim 64), kernel only;
# (3) CogVideoX 10% (D=64) over the sm90 regimes after the launch-order change.
set -uo pipefail
. benchmarks/device/common.sh
timeout 200 python3 -m tessera bench --shape hunyuan-720p --case random-10,dense --reps 3 \
  --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2>/dev/null
echo "bench hunyuan rc=$?"; cat "$out/bench_hunyuan.txt"
cube="[combine_threshold=0.0,pack_keys=True]"
timeout 120 python3 benchmarks/sweep.py --shape cogvideox-5b --family topk_pooled \
  --regime "sm90_64x64_w4_s3$cube" --regime "sm90_64x64_w8_s3$cube" --regime "sm90_64x64_w8_s4$cube" \
  --regime "sm90_64x64_w8_s5$cube" --regime "sm90_64x64_w4_s4$cube" 2>&1 | tee "$out/sweep_cubes_cog.txt"
timeout 150 python3 benchmarks/sweep.py --shape cogvideox-5b --density 0.1 --only sm90 2>&1 \
  | tee "$out/sweep_cog.txt" | head -8
