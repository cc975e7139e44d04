#!/usr/bin/env bash
# Prepared at the end of the seventeenth session, NOT yet run: the final tree's request path.
# (1) One request's kernels, no cache flush (plan_scan was 26 / 56 us on Wan / CogVideoX at
# 4e85298 in call_zz68; HunyuanVideo's 22,320 rows never timed). (2) Request times against the
# session's start (b5f099b), three rounds. (3) #4/#5's request bench at 10% on the final tree
# (call_zz69's ran with the reverted planner).
set -uo pipefail
. benchmarks/device/common.sh
for s in wan-1.3b-480p cogvideox-5b hunyuan-720p; do request_kernels rk_$s $s; done
request_ab 3 b5f099b wan-1.3b-480p cogvideox-5b
request_bench 170 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10
