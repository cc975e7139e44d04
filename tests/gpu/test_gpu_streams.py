"""GPU: a mask and the requests that read it are ordered whatever streams made and read them
(tessera/streams.py). Each scenario of ``stream_trials.py`` runs in a process of its own (a
fault ends that process, not the suite), 100 trials, each a new block matrix written late on
its producer's stream; every trial must give the float64 attention of that matrix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.stream_trials import SCENARIOS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 100
NEEDS = {"jax-arrays": "jax"}  # the rest need torch


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_trial_sees_the_mask_its_producer_wrote(scenario):
    pytest.importorskip(NEEDS.get(scenario, "torch"))
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tests.gpu.stream_trials", scenario,
                           str(TRIALS)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and lines, (
        f"{scenario}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    assert result["error"] is None, result["error"]
    assert result["right"] == TRIALS, (
        f"{scenario}: {TRIALS - result['right']} of {TRIALS} trials wrong (worst relative "
        f"error {result['worst']})")


def test_a_mark_orders_a_stream_being_captured():
    """A mask made outside a CUDA-graph capture, on another stream, and read by a request
    captured on the caller's stream: the capture waits for the mask's writes (a wait on an
    event recorded outside the capture), and the replays give the mask's attention."""
    torch = pytest.importorskip("torch")
    import numpy as np

    import tessera
    from tessera import reference

    h, n, block, d = 2, 6, 128, 64
    rng = np.random.default_rng(3)
    maker, side = torch.cuda.Stream(), torch.cuda.Stream()
    q, k, v = (torch.randn(1, h, n * block, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))

    def late_mask(blocks):
        with torch.cuda.stream(maker):
            torch.cuda._sleep(20_000_000)
            return tessera.BlockMask.from_dense(torch.from_numpy(blocks).to("cuda"),
                                                block_size=block)

    with torch.cuda.stream(side):
        tessera.attention(q, k, v, late_mask(rng.random((h, n, n)) < 0.4))  # the warm-up
    torch.cuda.synchronize()
    blocks = rng.random((h, n, n)) < 0.4
    mask = late_mask(blocks)  # side has not waited for this one
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = tessera.attention(q, k, v, mask)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference.attention(*(x.float().cpu().numpy().astype(np.float64) for x in (q, k, v)),
                              tessera.BlockMask.from_dense(blocks, block_size=block))
    got = out.float().cpu().numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
