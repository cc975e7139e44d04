"""Host microseconds of the pieces of a request (a CuPy RawKernel launch with the attention
kernel's 29 arguments, allocations, stream and event calls, the mask object, planning, running):
where the request path's remaining host time goes. GPU idle at the start of every call.

    python3 benchmarks/launch_costs.py
"""
import time, math, struct, ctypes
import numpy as np, torch, cupy as cp
import tessera
from tessera import api
from tessera.cuda.loader import load_kernel, smem_bytes
from cupy_backends.cuda.api import driver

def us(fn, n=300):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize(); return np.median(ts) * 1e6

h, d, L = 12, 128, 32760
q, k, v = (torch.randn(1, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
n = math.ceil(L / 128)
blocks = torch.from_numpy(np.random.default_rng(0).random((h, n, n)) < 0.1).cuda()
m = tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=L, seq_len_kv=L)
p = tessera.plan(m, num_q_heads=h, head_dim=d)
p.run(q, k, v)
fwd = p.regime.variant(d, True)
fn = load_kernel(fwd)
out = torch.empty_like(q)
lq = p.launch_queue
i64, i32, f32, ptr = np.int64, np.int32, np.float32, np.uint64
args = (lq.tasks, lq.spans, ptr(q.data_ptr()), i64(1), i64(1), i64(1), ptr(k.data_ptr()), i64(1), i64(1), i64(1),
        ptr(v.data_ptr()), i64(1), i64(1), i64(1), ptr(out.data_ptr()), i64(1), i64(1), i64(1), ptr(0), i64(0), i64(0),
        p._cache["part_o"], p._cache["part_lse"], i32(128), i32(1), f32(0.1), i32(0), ptr(0), ptr(0))
# grid 0 would fail; use max_tasks=0 so every CTA returns at once
s = cp.cuda.Stream.null
print("RawKernel launch (29 args, 1 CTA)", us(lambda: fn((1,), (fwd.threads,), args, shared_mem=smem_bytes(fwd), stream=s)))
print("args tuple build", us(lambda: (lq.tasks, lq.spans, ptr(q.data_ptr()), *map(i64, (1, 2, 3)), ptr(k.data_ptr()), *map(i64, (1,2,3)), ptr(v.data_ptr()), *map(i64, (1,2,3)), ptr(out.data_ptr()), *map(i64, (1,2,3)), ptr(0), i64(0), i64(0), i32(128), i32(1), f32(0.1), i32(0), ptr(0), ptr(0))))
print("cp.empty(100)", us(lambda: cp.empty(100, dtype=cp.int64)))
print("torch new_empty", us(lambda: q.new_empty((1, h, L, d))))
print("memsetAsync", us(lambda: cp.cuda.runtime.memsetAsync(out.data_ptr(), 0, 4, 0)))
print("torch current_stream", us(lambda: torch.cuda.current_stream(0).cuda_stream))
print("Stream.from_external", us(lambda: api._caller_stream(api._describe(q, k, v, "bhld"))))
print("_describe", us(lambda: api._describe(q, k, v, "bhld")))
print("Event record", us(lambda: cp.cuda.Event(disable_timing=True).record()))
print("from_dense", us(lambda: tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=L, seq_len_kv=L)))
print("plan", us(lambda: tessera.plan(m, num_q_heads=h, head_dim=d)))
print("p.run", us(lambda: p.run(q, k, v)))
print("p.run(out=)", us(lambda: p.run(q, k, v, out=out)))
print("attention", us(lambda: tessera.attention(q, k, v, m)))
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(200): p.run(q, k, v, out=out)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
