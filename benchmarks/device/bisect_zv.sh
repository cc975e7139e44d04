#!/usr/bin/env bash
# Eighth session: kernel-time A/B of main, overlap-pv and key-packing (their PRODUCER_REGS set to
# 56 in the unpacked copies), then main against gpu-pending (this checkout), alternating.
. benchmarks/device/common.sh
cases=("cogvideox-5b 0.1 sm90_128x128_w12_s3" "wan-1.3b-480p 0.1 sm90_128x64_w12_s4")
if [ "${1:-}" = branches ]; then
  ab_sweep 2 "pack_keys" ab_main ab_overlap-pv ab_key-packing -- "${cases[@]}"
else
  ab_sweep 3 "pack_keys" ab_main "$PWD" -- "${cases[@]}"
fi
