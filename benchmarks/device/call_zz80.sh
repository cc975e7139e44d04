#!/usr/bin/env bash
# Prepared at the end of the eighteenth session, NOT yet run. (0) The whole GPU suite: the
# session's last library commits (a review pass) ran on the CPU only. (1) The GPU test written after
# that session's device time ran out (test_torch_mask_copied_on_its_stream), with memcheck.
# (2) The request-path trims of 3bff4ee against the tree before them (216bff9), three rounds of
# alternating processes (request_hotspots: kernel, request alone, back to back, host), since
# call_zz79's line times of the trimmed from_dense came from an unusually slow process.
# (3) Both trees' line times of BlockMask.from_dense, one process each, twice.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 400 tests --maxfail=20  # (the review pass's refactors were never GPU-run)
gpu_tests gpu_new 200 tests/test_attention_gpu.py -k "torch_mask"
sanitize memcheck 200 "torch_mask_copied_on_its_stream"
request_ab 3 216bff9 wan-1.3b-480p cogvideox-5b
# (this tree's line_times.py over each tree's package: 216bff9 predates the script)
mkdir -p .lt/old && git archive 216bff9 tessera | tar -x -C .lt/old
for round in 1 2; do
  for t in "$PWD/.lt/old" "$PWD"; do
    PYTHONPATH=$t TESSERA_CACHE_DIR=/tmp/tc_lt timeout 120 python3 benchmarks/line_times.py \
      --what request --function tessera.mask.BlockMask.from_dense --n 300 --top 6 2>&1 \
      | head -4 | sed "s|^|$(basename "$t") $round: |"
  done
done
rm -rf .lt
