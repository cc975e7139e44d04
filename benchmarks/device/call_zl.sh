#!/usr/bin/env bash
# Seventh session: the order tasks launch in, for K/V reuse in L2 (benchmarks/task_order.py).
set -uo pipefail
. benchmarks/device/common.sh
for s in "cogvideox-5b 0.1" "cogvideox-5b 0.3" "wan-1.3b-480p 0.1" "hunyuan-720p 0.1"; do
  set -- $s
  timeout 120 python3 benchmarks/task_order.py --shape $1 --density $2 2>&1 | tee -a "$out/task_order.txt"
done
