#!/usr/bin/env bash
# Nineteenth session: a whole request captured into a CUDA graph (commit after e53d54f).
# (1) The capture tests and the tests of the paths it touches (kept plans, replans, torch
# masks, side streams); (2) memcheck on the capture tests; (3) the same capture test with the
# graph's memory NOT protected (capture_memory reduced to its flag): what the protection is
# for; (4) captured vs eager request times; (5) the whole GPU suite.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_capture 300 tests/test_attention_gpu.py -k \
  "captured_in_a_cuda_graph or cuda_graph or replan or reuse or torch_mask or side_stream or second_gpu"
sanitize memcheck 200 "captured_in_a_cuda_graph"
timeout 200 python3 - > "$out/unprotected.txt" 2>&1 <<'PY'
import contextlib, sys
sys.path.insert(0, "tests")
from tessera import _array, api, mask
import test_attention_gpu as t

@contextlib.contextmanager
def flag_only(framework, device_id):
    _array._capture.depth = getattr(_array._capture, "depth", 0) + 1
    try:
        yield
    finally:
        _array._capture.depth -= 1

for mod in (_array, api):
    mod.capture_memory = flag_only
api.poison_outputs = True
for fw in ("torch", "cupy"):
    try:
        t.test_request_captured_in_a_cuda_graph(fw)
        print(fw, "unprotected: PASSED (the protection was not needed here)")
    except BaseException as exc:
        print(fw, "unprotected: FAILED:", type(exc).__name__, (str(exc).splitlines() or [""])[0][:200])
PY
echo "unprotected probe:"; cat "$out/unprotected.txt" | tail -4
for shape in wan-1.3b-480p cogvideox-5b; do
  timeout 200 python3 benchmarks/captured_request.py --shape $shape --rounds 10 2>&1 | tail -2
done
gpu_tests gpu_tests 400 tests --maxfail=20
cd "$out" && tar czf logs.tgz *.txt && rm -f gpu_*.txt
