#!/usr/bin/env bash
# Eighth session: kernel-time A/B of main, overlap-pv and key-packing (their PRODUCER_REGS set to
# 56 in the unpacked copies), then main against gpu-pending (this checkout), alternating.
. benchmarks/device/common.sh
ab() {  # DIRS... : each shape's plain (unpacked) regime, from each package dir in turn
  for t in "$@"; do
    for s in "cogvideox-5b 0.1 sm90_128x128_w12_s3" "wan-1.3b-480p 0.1 sm90_128x64_w12_s4"; do
      set -- $s
      PYTHONPATH=$t timeout 30 python3 $t/benchmarks/sweep.py --shape $1 --density $2 --only $3 \
        2>&1 | grep -v pack_keys | tail -1 | sed "s|^|$(basename $t) |"
    done
  done
}
if [ "${1:-}" = branches ]; then
  for i in 1 2; do ab ab_main ab_overlap-pv ab_key-packing; done
else
  for i in 1 2 3; do ab ab_main $PWD; done
fi
