#!/usr/bin/env bash
# Tenth session: stall reasons (per issued instruction) where the Hopper family is furthest from
# its targets -- CogVideoX 10% (D=64; the MUFU was not it, call_zz8.sh) and Wan's 64-token top-k
# cubes (64-row tiles, 0.37x of the 128-block rate) -- next to Wan 10% (D=128, 128-row tiles).
set -uo pipefail
. benchmarks/device/common.sh
stalls="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for c in "0.1 cogvideox-5b" "topk_pooled wan-1.3b-480p" "0.1 wan-1.3b-480p"; do
  set -- $c
  timeout 100 ncu --metrics "$stalls,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active" \
    -k regex:bsa_fwd --launch-skip 2 --launch-count 1 python3 benchmarks/ncu_one.py $1 $2 \
    > "$out/ncu_stalls_$2_$1.txt" 2>&1
  echo "== ncu $2 $1 rc=$? $(grep -m1 regime: "$out/ncu_stalls_$2_$1.txt")"
  grep -E "stalled|issue_active|hmma|warps_active" "$out/ncu_stalls_$2_$1.txt" \
    | awk '$NF+0 >= 0.05 {print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
done
