#!/usr/bin/env bash
# Prepared for the next session (NOT yet run), after call_za.sh: full-size requests with the
# heuristic vs with a table (default tables/nvidia-h200.json; give the model-heads table's path
# in the tree as $1), same call, then what the lookup adds per plan. Decides whether tables
# can become the default (benchmarks/RESULTS.md, fifth session: not yet).
set -uo pipefail
. benchmarks/device/common.sh
table=${1:-tables/nvidia-h200.json}
b="--shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,dense --family all --reps 10"
timeout 100 python3 -m tessera bench $b --json "$out/bench_heuristic.json" > "$out/bench_heuristic.txt" 2>/dev/null
echo "bench (heuristic) rc=$?"; cat "$out/bench_heuristic.txt"
TESSERA_REGIME_TABLE="$table" timeout 100 python3 -m tessera bench $b --json "$out/bench_table.json" > "$out/bench_table.txt" 2>/dev/null
echo "bench (table $table) rc=$?"; cat "$out/bench_table.txt"
timeout 60 python3 benchmarks/table_overhead.py --table "$table" 2>&1 | tee "$out/table_overhead.txt"
