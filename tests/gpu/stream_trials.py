"""Trials of a mask made on one stream and used on another, one scenario a process.

``python -m tests.gpu.stream_trials SCENARIO TRIALS`` prints one JSON line: how many trials gave
the float64 attention of the mask as its producer wrote it. ``tests/gpu/test_gpu_streams.py`` runs
each scenario in a process of its own, so that a GPU fault (what an unordered mask can cause)
fails the scenario instead of ending the suite. In every trial the producer's stream is busy
first (a sleeping kernel), then writes a new random block matrix: a reader that is not ordered
after the producer sees the block matrix of an earlier trial, or memory nobody wrote yet.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np

import tessera
from tessera import reference

H, N, BLOCK, D = 2, 8, 128, 64
L = N * BLOCK
DENSITY = 0.35
SLEEP_CYCLES = 20_000_000  # ~10 ms of GPU time on the producer's stream
_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
"""


def _spin(stream) -> None:
    """Keep ``stream`` (CuPy) busy for SLEEP_CYCLES."""
    import cupy as cp

    kernel = cp.RawKernel(_SPIN, "spin")
    with stream:
        kernel((1,), (1,), (np.int64(SLEEP_CYCLES),))


def _torch_inputs(rng):
    import torch

    host = [rng.standard_normal((1, H, L, D)).astype(np.float32) for _ in range(3)]
    dev = [torch.from_numpy(x).to("cuda", torch.bfloat16) for x in host]
    exact = [t.float().cpu().numpy().astype(np.float64) for t in dev]
    torch.cuda.synchronize()
    return dev, exact


def _cupy_inputs(rng):
    import cupy as cp

    host = [rng.standard_normal((1, H, L, D)).astype(np.float16) for _ in range(3)]
    dev = [cp.asarray(x) for x in host]
    cp.cuda.Device().synchronize()
    return dev, [x.astype(np.float64) for x in host]


def _to_host(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.float().cpu().numpy().astype(np.float64)
    if type(x).__module__.startswith("cupy"):
        return x.get().astype(np.float64)
    return np.asarray(x.astype("float32")).astype(np.float64)


def _error(out, blocks: np.ndarray, exact) -> float:
    """Relative error of ``out`` against the float64 attention of ``blocks`` (inf for NaN)."""
    mask = tessera.BlockMask.from_dense(blocks, block_size=BLOCK)
    ref = reference.attention(*exact, mask)
    got = _to_host(out)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _torch_blocks(gen):
    import torch

    torch.cuda._sleep(SLEEP_CYCLES)
    return torch.rand(H, N, N, device="cuda", generator=gen) < DENSITY


def torch_side_stream(trials: int, rng) -> list[float]:
    """The reported case: the block matrix, the mask and the request on one torch side stream
    (torch's current stream all along)."""
    import torch

    (q, k, v), exact = _torch_inputs(rng)
    gen = torch.Generator(device="cuda").manual_seed(1)
    side = torch.cuda.Stream()
    errors = []
    for _ in range(trials):
        with torch.cuda.stream(side):
            blocks = _torch_blocks(gen)
            out = tessera.attention(q, k, v, tessera.BlockMask.from_dense(blocks,
                                                                          block_size=BLOCK))
        torch.cuda.synchronize()
        errors.append(_error(out, blocks.cpu().numpy(), exact))
    return errors


def torch_two_streams(trials: int, rng) -> list[float]:
    """The mask made on one torch side stream, the request on another that never waited for
    it (the caller ordered nothing: the mask is Tessera's to order)."""
    import torch

    (q, k, v), exact = _torch_inputs(rng)
    gen = torch.Generator(device="cuda").manual_seed(2)
    maker, user = torch.cuda.Stream(), torch.cuda.Stream()
    errors = []
    for _ in range(trials):
        with torch.cuda.stream(maker):
            blocks = _torch_blocks(gen)
            mask = tessera.BlockMask.from_dense(blocks, block_size=BLOCK)
        with torch.cuda.stream(user):
            out = tessera.attention(q, k, v, mask)
        torch.cuda.synchronize()
        errors.append(_error(out, blocks.cpu().numpy(), exact))
    return errors


def _cupy_blocks(stream, seed: int):
    import cupy as cp

    _spin(stream)
    with stream:
        return cp.random.default_rng(seed).random((H, N, N)) < DENSITY


def cupy_streams(trials: int, rng) -> list[float]:
    """Two non-blocking CuPy streams: the mask made on one, the request (CuPy arrays) on the
    other, CuPy's current stream then."""
    import cupy as cp

    (q, k, v), exact = _cupy_inputs(rng)
    maker, user = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    errors = []
    for t in range(trials):
        blocks = _cupy_blocks(maker, t)
        with maker:
            mask = tessera.BlockMask.from_dense(blocks, block_size=BLOCK)
        with user:
            out = tessera.attention(q, k, v, mask)
        cp.cuda.Device().synchronize()
        errors.append(_error(out, blocks.get(), exact))
    return errors


def _cupy_to_torch_side(trials: int, rng, maker) -> list[float]:
    import cupy as cp
    import torch

    (q, k, v), exact = _torch_inputs(rng)
    side = torch.cuda.Stream()
    errors = []
    for t in range(trials):
        blocks = _cupy_blocks(maker, t)
        with maker:
            mask = tessera.BlockMask.from_dense(blocks, block_size=BLOCK)
        with torch.cuda.stream(side):
            out = tessera.attention(q, k, v, mask)
        cp.cuda.Device().synchronize()
        errors.append(_error(out, blocks.get(), exact))
    return errors


def legacy_to_torch_side(trials: int, rng) -> list[float]:
    """The mask made on CuPy's legacy default stream, the request on a torch side stream
    (which does not wait for the legacy stream)."""
    import cupy as cp

    return _cupy_to_torch_side(trials, rng, cp.cuda.Stream.null)


def per_thread_to_torch_side(trials: int, rng) -> list[float]:
    """The mask made on CuPy's per-thread default stream, the request on a torch side stream."""
    import cupy as cp

    return _cupy_to_torch_side(trials, rng, cp.cuda.Stream.ptds)


def jax_arrays(trials: int, rng) -> list[float]:
    """A JAX block matrix (computed after a long JAX computation it depends on, dispatched
    asynchronously) and JAX q, k, v."""
    import jax
    import jax.numpy as jnp

    host = [rng.standard_normal((1, H, L, D)).astype(np.float32) for _ in range(3)]
    q, k, v = (jnp.asarray(x, dtype=jnp.bfloat16) for x in host)
    exact = [np.asarray(t.astype(jnp.float32)).astype(np.float64) for t in (q, k, v)]
    big = jnp.asarray(rng.standard_normal((4096, 4096)), dtype=jnp.float32)
    errors = []
    for t in range(trials):
        x = big
        for _ in range(8):
            x = jnp.tanh(x @ big)
        late = jax.random.uniform(jax.random.PRNGKey(t), (H, N, N)) + 0.0 * x[0, 0]
        blocks = late < DENSITY
        out = tessera.attention(q, k, v, tessera.BlockMask.from_dense(blocks,
                                                                      block_size=BLOCK))
        errors.append(_error(out, np.asarray(blocks), exact))
    return errors


def plan_then_run_elsewhere(trials: int, rng) -> list[float]:
    """A mask made and planned (tessera.plan) on a non-blocking CuPy stream, the plan run on a
    torch side stream."""
    import cupy as cp
    import torch

    (q, k, v), exact = _torch_inputs(rng)
    maker = cp.cuda.Stream(non_blocking=True)
    side = torch.cuda.Stream()
    errors = []
    for t in range(trials):
        blocks = _cupy_blocks(maker, t)
        with maker:
            p = tessera.plan(tessera.BlockMask.from_dense(blocks, block_size=BLOCK),
                             num_q_heads=H, head_dim=D)
        with torch.cuda.stream(side):
            out = p.run(q, k, v)
        cp.cuda.Device().synchronize()
        errors.append(_error(out, blocks.get(), exact))
    return errors


def mask_dropped_while_read(trials: int, rng) -> list[float]:
    """The mask made on a non-blocking CuPy stream and dropped right after a request on a busy
    torch side stream, whose planner has not read it yet; the maker's stream then allocates and
    overwrites memory of the mask's size at once (CuPy's pool gives a block freed on a stream to
    that stream's next allocation). No plan is kept, so only Tessera holds the mask."""
    import cupy as cp
    import torch

    tessera.config.request_plans_kept = 0
    (q, k, v), exact = _torch_inputs(rng)
    maker = cp.cuda.Stream(non_blocking=True)
    side = torch.cuda.Stream()
    errors = []
    for t in range(trials):
        with maker:
            blocks = cp.random.default_rng(t).random((H, N, N)) < DENSITY
            mask = tessera.BlockMask.from_dense(blocks, block_size=BLOCK)
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            out = tessera.attention(q, k, v, mask)
        del mask
        with maker:
            for _ in range(4):
                cp.full(H * N * N, 255, dtype=cp.uint8)
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
        errors.append(_error(out, blocks.get(), exact))
    return errors


SCENARIOS = {f.__name__.replace("_", "-"): f for f in (
    torch_side_stream, torch_two_streams, cupy_streams, legacy_to_torch_side,
    per_thread_to_torch_side, jax_arrays, plan_then_run_elsewhere, mask_dropped_while_read)}


def main(argv: list[str]) -> int:
    name, trials = argv[0], int(argv[1])
    tessera.config.poison_outputs = True  # an unwritten element is NaN: an error of inf
    result = {"scenario": name, "trials": trials, "right": 0, "worst": None, "error": None}
    try:
        errors = SCENARIOS[name](trials, np.random.default_rng(0))
        result["right"] = sum(e < 1e-2 for e in errors)
        result["worst"] = max(errors)
    except Exception:  # a fault surfaces here or at exit; either fails the scenario
        result["error"] = traceback.format_exc(limit=4)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
