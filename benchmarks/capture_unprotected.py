"""What the memory of a captured request is protected for: runs the GPU test
test_request_captured_in_a_cuda_graph with tessera's capture memory reduced to its flag (CuPy's
pool then serves the request's arrays during the capture, as it would without it) and reports
how each framework's case fails. A diagnostic for benchmarks/RESULTS.md, not a test.

    PYTHONPATH=. python3 benchmarks/capture_unprotected.py
"""

import contextlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from tessera import _array, api  # noqa: E402

import test_attention_gpu  # noqa: E402


@contextlib.contextmanager
def flag_only(framework, device_id):
    _array._capture.depth = getattr(_array._capture, "depth", 0) + 1
    try:
        yield
    finally:
        _array._capture.depth -= 1


def main() -> int:
    _array.capture_memory = api.capture_memory = flag_only
    api.poison_outputs = True
    for fw in ("torch", "cupy"):
        try:
            test_attention_gpu.test_request_captured_in_a_cuda_graph(fw)
            print(fw, "unprotected: passed (the protection was not needed here)")
        except BaseException as exc:  # noqa: BLE001 - any failure is the answer
            first = (str(exc).splitlines() or [""])[0][:200]
            print(fw, "unprotected: FAILED:", type(exc).__name__, first)
    return 0


if __name__ == "__main__":
    sys.exit(main())
