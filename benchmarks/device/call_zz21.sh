#!/usr/bin/env bash
# Eleventh session, last call: the split rule's task slots from the driver's occupancy for
# one-task CTAs (regime._device_tasks_in_flight): the whole GPU suite (with the new
# test_portable_plan_counts_its_slots_by_occupancy), then the portable family's request on
# CogVideoX (sync-free now: call_zz19.sh had it synchronizing, back to back 21% above its kernel).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
timeout 150 python3 -m tessera bench --shape cogvideox-5b --case random-10,random-30,band-16,dense \
  --regime "sm80_128x64_w4_s2[combine_threshold=0.0]" --reps 10 --json "$out/bench_sm80_cog.json" \
  > "$out/bench_sm80_cog.txt" 2>/dev/null
echo "bench rc=$?"; cat "$out/bench_sm80_cog.txt"
