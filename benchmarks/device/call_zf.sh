#!/usr/bin/env bash
# Sixth session, last call: the H200 table at the models' head counts, from scratch at this
# commit (sync-free planning changes every candidate's planning time; candidates that plan
# alike are now timed once), then, if it finished, its held-out evaluation for what budget is left. Whatever
# is unfinished resumes next session from the copies in benchmarks/figures/.
set -uo pipefail
. benchmarks/device/common.sh
opts=(--kernel-families sm90 --combine-thresholds 0 --heads model)
table="$out/nvidia-h200-model-heads.json"
profile_table "$table" 480 7.3 "${opts[@]}" && evaluate_table "$table" 60 0.8 "${opts[@]}"
