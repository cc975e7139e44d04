"""GPU pytest-benchmark suite: kernel-only and request time per model shape x mask family, the
forward's and the backward's.

    PYTHONPATH=. python -m pytest benchmarks/test_bench_gpu.py --benchmark-enable \
        --benchmark-json=bench_gpu.json -q

Marked ``gpu`` (skipped without one). Inputs are CuPy fp16 (no PyTorch needed). "kernel" times
``Plan.run`` of a plan made once; "request" times ``tessera.attention`` with the mask already on
the device (planning + launches + kernels every call; a kept plan replanned where the regime was
chosen by the geometry); "captured request" replays that request captured into a CUDA graph (the
planner's kernels and the attention kernel, no host work); "backward" times ``Plan.run_backward``
(its queues planned once) from the forward's output and LSE, "forward+backward" the forward that
saves its LSE and then that, "backward request" ``tessera.attention_backward`` (the queues planned
every call: by the planner kernels, with no synchronization, for a mask on the device). Every timed
call ends with a device synchronize so the wall-clock pytest-benchmark measures includes the GPU
work.
Useful FLOPs for a row = 4 * D * ``extra_info["useful_pairs"]``.

Run on the H200: figures in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import pytest

import tessera
from tessera.tools.workloads import FAMILIES, WORKLOADS, example_mask

pytestmark = pytest.mark.gpu

SHAPES = ("wan-1.3b-480p", "cogvideox-5b", "hunyuan-720p")
HEADS = 4  # a slice of each model's heads keeps the suite short; per-head work is unchanged
_cache: dict = {}


def _case(shape: str, family: str):
    """(q, k, v, device mask, plan) for one cell, built once per session."""
    key = (shape, family)
    if key not in _cache:
        import cupy as cp

        w = WORKLOADS[shape]
        vm = example_mask(w, family, heads=HEADS)
        mask = vm.mask.to_device()
        h = max(HEADS, mask.batch_heads[1])
        q, k, v = (cp.random.standard_normal((1, h, w.seq_len, w.head_dim), dtype=cp.float32)
                   .astype(cp.float16) for _ in range(3))
        p = tessera.plan(mask, num_q_heads=h, head_dim=w.head_dim, dtype="float16",
                         arch=int(cp.cuda.Device().compute_capability))
        _cache[key] = (q, k, v, mask, p)
    return _cache[key]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel(benchmark, shape, family):
    import cupy as cp

    q, k, v, mask, p = _case(shape, family)
    sync = cp.cuda.Device().synchronize
    benchmark.extra_info.update(useful_pairs=int(mask.selected_pairs(1, q.shape[1]).sum()),
                                density=mask.density, regime=p.regime.name)
    benchmark(lambda: (p.run(q, k, v), sync()))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_request(benchmark, shape, family):
    import cupy as cp

    q, k, v, mask, _ = _case(shape, family)
    sync = cp.cuda.Device().synchronize
    benchmark.extra_info.update(useful_pairs=int(mask.selected_pairs(1, q.shape[1]).sum()))
    benchmark(lambda: (tessera.attention(q, k, v, mask), sync()))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_captured_request(benchmark, shape, family):
    import cupy as cp

    q, k, v, mask, _ = _case(shape, family)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        tessera.attention(q, k, v, mask)  # the warm-up a capture needs
        stream.begin_capture()
        try:
            tessera.attention(q, k, v, mask)
        finally:
            graph = stream.end_capture()
    benchmark.extra_info.update(useful_pairs=int(mask.selected_pairs(1, q.shape[1]).sum()))
    benchmark(lambda: (graph.launch(stream), stream.synchronize()))
    tessera.release_captured_memory()  # (the graph is never launched again)


def _backward_case(benchmark, shape: str, family: str):
    """One cell's operands, the forward's out and LSE, a dout, and the device synchronize each
    timed call ends with; the useful pairs recorded."""
    import cupy as cp

    q, k, v, mask, p = _case(shape, family)
    out, lse = p.run(q, k, v, return_lse=True)
    dout = cp.ones_like(out)
    benchmark.extra_info.update(useful_pairs=int(mask.selected_pairs(1, q.shape[1]).sum()))
    return (q, k, v, mask, p), (out, lse, dout), cp.cuda.Device().synchronize


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward(benchmark, shape, family):
    (q, k, v, _, p), (out, lse, dout), sync = _backward_case(benchmark, shape, family)
    p.run_backward(q, k, v, out, lse, dout)  # (plans the backward queues)
    benchmark(lambda: (p.run_backward(q, k, v, out, lse, dout), sync()))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward(benchmark, shape, family):
    (q, k, v, _, p), (out, lse, dout), sync = _backward_case(benchmark, shape, family)
    p.run_backward(q, k, v, out, lse, dout)  # (plans the backward queues)

    def step():
        o, m = p.run(q, k, v, return_lse=True)
        return p.run_backward(q, k, v, o, m, dout)

    benchmark(lambda: (step(), sync()))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_request(benchmark, shape, family):
    (q, k, v, mask, _), (out, lse, dout), sync = _backward_case(benchmark, shape, family)
    benchmark(lambda: (tessera.attention_backward(q, k, v, out, lse, dout, mask), sync()))
