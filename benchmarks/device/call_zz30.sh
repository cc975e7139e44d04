#!/usr/bin/env bash
# Twelfth session: memcheck on the planner cases call_zz29.sh's 60 s did not reach (variable
# blocks with empty rows, all blocks, many runs, more keys than the shared-memory table).
set -uo pipefail
. benchmarks/device/common.sh
sanitize memcheck 150 "device_planner_equals_host and (many or variable or all)"
