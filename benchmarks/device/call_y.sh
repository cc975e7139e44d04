#!/usr/bin/env bash
# Fifth session: the committed H200 table resumed with the two short-clip shapes (sequences
# under 16k tokens had no entries: the held-out cogvideox-5b-9f masks were most of call_w's
# misses), its held-out evaluation, then requests with the heuristic vs with the table, same call.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
cp tables/nvidia-h200.json "$out/nvidia-h200.json"
s=$(date +%s)
timeout 200 python3 -m tessera profile --resume --out "$out/nvidia-h200.json" --kernel-families sm90 \
  --budget-minutes 2.8 > "$out/profile.txt" 2>&1
echo "profile rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/profile.txt)"
s=$(date +%s)
timeout 170 python3 -m tessera profile --evaluate "$out/nvidia-h200.json" --kernel-families sm90 \
  --out "$out/eval.json" --budget-minutes 2.5 > "$out/eval.txt" 2>&1
echo "evaluate rc=$? $(( $(date +%s)-s ))s"; tail -3 "$out/eval.txt"
b="--shape wan-1.3b-480p,cogvideox-5b --case random-10,dense --family all --reps 10"
timeout 80 python3 -m tessera bench $b --json "$out/bench_heuristic.json" > "$out/bench_heuristic.txt" 2>/dev/null
echo "bench (heuristic) rc=$?"; cat "$out/bench_heuristic.txt"
TESSERA_REGIME_TABLE="$out/nvidia-h200.json" timeout 80 python3 -m tessera bench $b --json "$out/bench_table.json" > "$out/bench_table.txt" 2>/dev/null
echo "bench (table) rc=$?"; cat "$out/bench_table.txt"
