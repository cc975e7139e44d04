#!/usr/bin/env bash
# Fifth session, last minutes of device time: the one-kernel mask measures (mask_pairs) — its
# GPU test, then what the table lookup adds to planning and requests (table vs heuristic).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_regime.py -k "device_measures" > "$out/test.txt" 2>&1
echo "test rc=$?: $(tail -1 $out/test.txt)"; grep -E "^E " "$out/test.txt" | head -5
timeout 90 python3 benchmarks/table_overhead.py --table tables/nvidia-h200.json 2>&1 | tee "$out/table_overhead.txt"
