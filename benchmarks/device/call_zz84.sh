#!/usr/bin/env bash
# Nineteenth session: captured requests at the two shapes whose eager plans synchronize once
# (bounds over SYNC_FREE_WORKSPACE_LIMIT): HunyuanVideo and Wan-14B, random 10%; the captured
# plan is sync-free with bounds up to 1 GiB. Output agreement with the eager request reported.
set -uo pipefail
. benchmarks/device/common.sh
for shape in hunyuan-720p wan-14b-720p; do
  timeout 250 python3 benchmarks/captured_request.py --shape $shape --rounds 3 2>&1 | tail -3
done
