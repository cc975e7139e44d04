"""Host microseconds of the CUDA calls a request is made of, in isolation: a CuPy RawKernel
launch by argument count (scalars and pointers converted at each call, or held as numpy
scalars), a CUDA graph of three launches replayed, a device-to-device copy, an event record,
the capture query, a stream wrapper and a torch allocation -- what bounds a request's host
time whatever the library does in Python around them.

    python3 benchmarks/launch_overhead.py [--n 2000]
"""

import argparse
import time

import cupy as cp
import numpy as np
import torch

SOURCE = r"""
extern "C" __global__ void args1(long long a) {}
extern "C" __global__ void args13(long long a0, int a1, int a2, int a3, long long a4, int a5,
    long long a6, long long a7, long long a8, long long a9, long long a10, long long a11,
    int a12) {}
extern "C" __global__ void args26(long long a0, int a1, int a2, long long a3, long long a4,
    int a5, long long a6, long long a7, long long a8, long long a9, long long a10, long long a11,
    long long a12, long long a13, long long a14, long long a15, long long a16, long long a17,
    long long a18, long long a19, long long a20, long long a21, long long a22, long long a23,
    long long a24, long long a25) {}
"""


def us(fn, n: int) -> float:
    """Mean host microseconds of ``fn`` over n calls in batches of 50, synchronizing between
    batches (the GPU never far behind)."""
    total = 0.0
    for _ in range(n // 50):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        total += time.perf_counter() - t0
    cp.cuda.Device().synchronize()
    return total / (n // 50 * 50) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    n = args.n
    mod = cp.RawModule(code=SOURCE)
    k1, k13, k26 = (mod.get_function(f"args{i}") for i in (1, 13, 26))
    buf = cp.zeros(1 << 20, dtype=cp.uint8)
    other = cp.zeros(1 << 20, dtype=cp.uint8)
    p = np.uint64(buf.data.ptr)
    held13 = (p, np.int32(1), np.int32(2), np.int32(3), p, np.int32(5), p, p, p, p, p, p,
              np.int32(12))
    held26 = (p, np.int32(1), np.int32(2)) + (p,) * 2 + (np.int32(5),) + (p,) * 20
    rows = [
        ("launch, 1 argument", lambda: k1((1,), (32,), (p,))),
        ("launch, 13 held numpy scalars", lambda: k13((1,), (32,), held13)),
        ("launch, 13 converted at the call", lambda: k13((1,), (32,), (
            buf, np.int32(1), np.int32(2), np.int32(3), buf, np.int32(5), buf, buf, buf, buf,
            buf, buf, np.int32(12)))),
        ("launch, 26 held numpy scalars", lambda: k26((1,), (32,), held26)),
    ]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(2):
            k13((1,), (32,), held13)
        stream.begin_capture()
        k13((1,), (32,), held13)
        k26((1,), (32,), held26)
        k13((1,), (32,), held13)
        graph = stream.end_capture()
    graph.upload(stream)
    ev = cp.cuda.Event(disable_timing=True)
    ptr = stream.ptr
    rows += [
        ("graph of 3 launches, replayed", lambda: graph.launch(stream)),
        ("device copy, 1 MiB", lambda: other.data.copy_from_device_async(buf.data, 1 << 20,
                                                                         stream)),
        ("event record", lambda: ev.record(stream)),
        ("cudaStreamIsCapturing", lambda: cp.cuda.runtime.streamIsCapturing(ptr)),
        ("Stream.from_external", lambda: cp.cuda.Stream.from_external(stream)),
        ("cp.empty, 1 MiB", lambda: cp.empty(1 << 20, dtype=cp.uint8)),
    ]
    t = torch.empty(4, 12, 1024, 64, device="cuda", dtype=torch.bfloat16)
    rows.append(("torch new_empty", lambda: t.new_empty((4, 12, 1024, 64))))
    # The library's per-launch lookups (dataclass hashes behind lru caches).
    from tessera.cuda.loader import device_cc, load_kernel, smem_bytes
    from tessera.runtime.regime import default_regime

    r = default_regime(device_cc(), 128)
    variant = r.variant(128, True)
    rows += [("hash(Regime)", lambda: hash(r)), ("hash(Variant)", lambda: hash(variant)),
             ("Regime.variant (cached)", lambda: r.variant(128, True)),
             ("smem_bytes (cached)", lambda: smem_bytes(variant)),
             ("load_kernel (cached)", lambda: load_kernel(variant)),
             ("device_cc()", device_cc)]
    for name, fn in rows:
        try:
            fn()
            print(f"{name:40} {us(fn, n):7.2f} us")
        except Exception as exc:  # a CuPy without the call: say so, time the rest
            print(f"{name:40} failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
