#!/usr/bin/env bash
# Sixth session: the rest of call_zf.sh's held-out evaluation (--resume from its copy).
set -uo pipefail
. benchmarks/device/common.sh
cp benchmarks/figures/eval_h200_model_heads_2026-11-30.json "$out/eval.json"
timeout 200 python3 -m tessera profile --evaluate benchmarks/figures/nvidia-h200-model-heads_2026-11-30.json \
  --out "$out/eval.json" --resume --budget-minutes 2.8 --kernel-families sm90 --combine-thresholds 0 --heads model \
  > "$out/eval.txt" 2>&1
echo "evaluate rc=$?"; tail -3 "$out/eval.txt"
