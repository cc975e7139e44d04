#!/usr/bin/env bash
# Sixth session, first call: the GPU tests of the fifth session's unrun change (task counter per
# plan and stream, CUDA-graph capture), where a request's host time goes (cProfile of 200
# requests per shape, plus back-to-back and host-only times), then the H200 table at the models'
# own head counts (--heads model), one-sync mapping only (--combine-thresholds 0). The profile
# resumes in call_zb.sh if its budget stops it here.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests graph_tests 120 tests/test_attention_gpu.py -k "graph or persistent or stream"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 60 python3 benchmarks/request_hotspots.py --shape $s > "$out/request_hotspots_$s.txt" 2>&1
  echo "request hotspots $s rc=$?: $(tail -1 $out/request_hotspots_$s.txt)"
done
opts=(--kernel-families sm90 --combine-thresholds 0 --heads model)
profile_table "$out/nvidia-h200-model-heads.json" 300 4.5 "${opts[@]}"
