"""``python -m tessera demo``: Tessera on a Wan-2.1-1.3B-shaped attention with two real mask
families (sliding tiles and top-k pooled cubes), checked against the float64 reference.

On a GPU: 12 heads x 32,760 tokens x 128, bf16 (PyTorch) or fp16 (CuPy); outputs are checked on
sampled rows and timed against dense SDPA when PyTorch is there. Without a GPU: the same plans at
a reduced size, executed by the CPU emulator and checked in full.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import tessera

from .. import families, reference
from .._array import cupy_or_none
from ..cuda import device
from ..runtime import emulate
from ..runtime.plan import plan
from .workloads import STA_WINDOWS, WORKLOADS

WAN_LATENT = WORKLOADS["wan-1.3b-480p"].latent


def _gpu_available() -> bool:
    return device.gpu_count() > 0


def _families(q: Any, k: Any, latent: tuple[int, int, int], heads: int,
              tile: tuple[int, int, int]) -> list[tuple[str, families.VideoMask]]:
    windows = [STA_WINDOWS[h % len(STA_WINDOWS)] for h in range(heads)]
    n_cubes = math.prod(-(-a // 4) for a in latent)
    return [
        ("sliding tile (STA)", families.sliding_tile(latent, tile=tile, window=windows)),
        ("top-k pooled cubes", families.topk_pooled(q, k, latent, cube=(4, 4, 4),
                                                 topk=max(2, round(0.1 * n_cubes)))),
    ]


def run(size: str = "auto") -> int:
    """Run the demo; ``size`` "auto" picks the GPU run when a GPU is there."""
    if size == "auto":
        size = "full" if _gpu_available() else "small"
    if size == "small":
        return _run_cpu()
    if not _gpu_available():
        print("No CUDA GPU found: `python -m tessera demo --size small` runs the CPU emulator.")
        return 1
    return _run_gpu()


def _run_cpu() -> int:
    latent, heads, d = (4, 8, 16), 2, 64
    L = math.prod(latent)
    print(f"No GPU: running Tessera's plans on the CPU emulator at a reduced size "
          f"(latent {latent}, {L} tokens, {heads} heads, head dim {d}, float64).")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, L, d)) for _ in range(3))
    worst = 0.0
    for name, vm in _families(q, k, latent, heads, tile=(2, 4, 4)):
        qp, kp, vp = (families.apply_permutation(x, vm.permutation, axis=2) for x in (q, k, v))
        p = plan(vm.mask, num_q_heads=heads, head_dim=d, batch=1)
        t0 = time.perf_counter()
        res = emulate.run(p, qp, kp, vp)
        dt = time.perf_counter() - t0
        ref = reference.attention(qp, kp, vp, vm.mask)
        err = float(np.abs(res.out - ref).max())
        worst = max(worst, err)
        print(f"  {name:20} density {vm.mask.density:5.3f}  max |emulator - reference| "
              f"{err:.1e}  pairs outside the mask {res.pairs_outside}  ({dt:.1f} s)")
        print(f"    plan: {p.stats()}")
    ok = worst < 1e-10
    print("OK: the task queues compute exactly the logical masks." if ok else "MISMATCH")
    return 0 if ok else 1


def _run_gpu() -> int:
    cp = cupy_or_none()
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        torch = None
    heads, d = 12, 128
    L = math.prod(WAN_LATENT)
    fw = "torch bf16" if torch is not None else "CuPy fp16"
    print(f"Wan-2.1-1.3B-shaped self-attention: {heads} heads x {L} tokens x {d}, {fw}, "
          f"{device.current_gpu_name()}")
    if torch is not None:
        q, k, v = (torch.randn(1, heads, L, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        qf, kf = cp.from_dlpack(q.float()), cp.from_dlpack(k.float())
        take = lambda x, perm: x[:, :, torch.as_tensor(perm, device="cuda")]  # noqa: E731
    else:
        q, k, v = (cp.random.standard_normal((1, heads, L, d), dtype=cp.float32)
                   .astype(cp.float16) for _ in range(3))
        qf, kf = q.astype(cp.float32), k.astype(cp.float32)
        take = lambda x, perm: x[:, :, cp.asarray(perm)]  # noqa: E731

    def timed(fn, reps=10):
        fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        cp.cuda.Device().synchronize()
        return (time.perf_counter() - t0) / reps * 1e3

    dense_ms = None
    if torch is not None:
        import torch.nn.functional as F  # noqa: PLC0415

        dense_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v))
        print(f"dense SDPA (PyTorch's default backend): {dense_ms:.2f} ms")
    rng = np.random.default_rng(0)
    worst = 0.0
    for name, vm in _families(qf, kf, WAN_LATENT, heads, tile=(6, 8, 8)):
        perm = vm.permutation
        qp, kp, vp = (take(x, perm) if perm is not None else x for x in (q, k, v))
        mask = vm.mask.to_device()
        out = tessera.attention(qp, kp, vp, mask)
        rows = np.stack([np.zeros(256, np.int64), rng.integers(0, heads, 256),
                         rng.integers(0, L, 256)], axis=1)
        got = _rows_of(out, rows)
        # The reference reads float32 copies (CuPy has no bfloat16 to view torch's data with).
        exact = [x.float() if torch is not None else x.astype(cp.float32) for x in (qp, kp, vp)]
        ref = reference.attention_rows(*exact, mask, rows)
        del exact
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        worst = max(worst, err)
        req_ms = timed(lambda: tessera.attention(qp, kp, vp, mask))
        p = tessera.plan(mask, num_q_heads=heads, head_dim=d,
                         dtype="bfloat16" if torch is not None else "float16")
        run_ms = timed(lambda: p.run(qp, kp, vp))
        pairs = int(mask.selected_pairs(1, heads).sum())
        line = (f"  {name:20} density {mask.density:5.3f}  request {req_ms:6.2f} ms  kernel "
                f"{run_ms:6.2f} ms ({4 * d * pairs / run_ms / 1e9:4.0f} TFLOP/s useful)  "
                f"sampled-row rel. error {err:.1e}")
        if dense_ms is not None:
            line += f"  speedup over dense: {dense_ms / req_ms:4.2f}x request, " \
                    f"{dense_ms / run_ms:4.2f}x kernel"
        print(line)
    ok = worst < 1e-2
    print("OK: outputs match the float64 reference on sampled rows." if ok else "MISMATCH")
    return 0 if ok else 1


def _rows_of(out: Any, rows: np.ndarray) -> np.ndarray:
    if type(out).__module__.startswith("torch"):
        import torch  # noqa: PLC0415 - out is a torch tensor, so torch is there

        idx = [torch.as_tensor(rows[:, i], device=out.device) for i in range(3)]
        return out[idx[0], idx[1], idx[2]].float().cpu().numpy().astype(np.float64)
    sel = out[rows[:, 0], rows[:, 1], rows[:, 2]]
    return sel.get().astype(np.float64)
