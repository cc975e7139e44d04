#!/usr/bin/env bash
# Prepared at the end of the ninth session, NOT yet run (after call_zz6.sh): #4's open item --
# the portable family forced on the H200 ran dense Wan at 271 TFLOP/s against FA2's 358. ncu of
# the sm80 kernel (default portable regime) next to FA2's dense kernel through torch SDPA's
# flash backend, same sections, to see where the mma.sync kernel loses.
set -uo pipefail
. benchmarks/device/common.sh
sections="--section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
timeout 150 ncu $sections -k regex:bsa_fwd --launch-skip 2 --launch-count 1 \
  python3 benchmarks/ncu_one.py 1.0 wan-1.3b-480p sm80_128x64_w4_s2 > "$out/ncu_sm80.txt" 2>&1
echo "ncu sm80 rc=$?"
timeout 150 ncu $sections -k regex:flash --launch-skip 2 --launch-count 1 python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn(1, 12, 32760, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(4): F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()" > "$out/ncu_fa2.txt" 2>&1
echo "ncu fa2 rc=$?"
for f in sm80 fa2; do
  echo "== $f"; grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|highest-utilized|Shared Memory Configuration|Bank" "$out/ncu_$f.txt" | head -12
done
