#!/usr/bin/env bash
# Sixth session, third call: where a sync-free request's host time goes now (phases and
# cProfile), after caching the per-request regime arithmetic and reading torch masks without
# DLPack; the new interop test.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests interop_tests 100 tests/test_attention_gpu.py -k "torch or never_waits or graph"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 60 python3 benchmarks/request_phases.py --shape $s --profile > "$out/phases_$s.txt" 2>&1
  echo "== $s rc=$?"; grep -E " us host|density" "$out/phases_$s.txt"
done
