#!/usr/bin/env bash
# Fifth session, final figures at HEAD (persistent producer kernel, the sm90 H200 table): which
# table is in use, then the bench against the baselines (dense SDPA cuDNN/flash, FlexAttention)
# on Wan and CogVideoX, and HunyuanVideo at ~10%.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
python3 -m tessera info 2>&1 | tee "$out/info.txt" | grep -iE "table|regime" | head -8
timeout 240 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --family all \
  --reps 10 --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench.txt"; tail -2 "$out/bench_err.txt"
timeout 170 python3 -m tessera bench --shape hunyuan-720p --case random-10 --family sliding_tile,topk_pooled \
  --reps 3 --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2>/dev/null; echo "bench rc=$?"; cat "$out/bench_hunyuan.txt"
