#!/usr/bin/env bash
# Thirteenth session, run as one command after call_zz34.sh: #5's CogVideoX cases with the
# default regime (no wide step) beside cuDNN, FA2 and FlexAttention in one process.
set -uo pipefail
. benchmarks/device/common.sh
request_bench 120 --shape cogvideox-5b --case dense,random-10,random-30 --reps 10
