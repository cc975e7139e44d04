"""A whole request captured into a CUDA graph against the same request made eagerly, in one
process: the mask object built from the model's block matrix (a torch tensor the graph reads at
each replay), planned on the GPU and run. The graph replays it with no host work at all, so its
time is the planner's kernels plus the attention kernel; the eager request adds the host path
(kept plans, tessera.api.request_plans_kept). Each is timed alone (CUDA events, GPU idle at the
start) and back to back (20 between synchronizations), alternating for --rounds rounds.

    python3 benchmarks/captured_request.py [--shape wan-1.3b-480p] [--density 0.1] [--rounds 10]
"""

import argparse
import statistics
import sys

import tessera
from tessera.bench import cuda_time_ms

from request_hotspots import random_request  # this folder's: run as a script


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)

    def request():
        return tessera.attention(q, k, v, new_mask())

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        request()  # the warm-up a capture needs (kernels loaded, constants on the GPU)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = request()
    eager_out = request()
    graph.replay()
    torch.cuda.synchronize()
    # The same mask and inputs: the captured plan is the sync-free regime, which may differ
    # from the eager one only in its split policy, so the outputs agree to rounding.
    diff = (captured.float() - eager_out.float()).abs().max().item()
    p = tessera.plan(new_mask(), num_q_heads=h, head_dim=d)
    times = {"kernel": [], "eager": [], "graph": [], "eager b2b": [], "graph b2b": []}
    for _ in range(args.rounds):
        times["kernel"].append(cuda_time_ms(lambda: p.run(q, k, v), 5, burst=5))
        times["eager"].append(cuda_time_ms(request, 5))
        times["graph"].append(cuda_time_ms(graph.replay, 5))
        times["eager b2b"].append(cuda_time_ms(lambda: [request() for _ in range(20)], 1) / 20)
        times["graph b2b"].append(cuda_time_ms(lambda: [graph.replay() for _ in range(20)], 1)
                                  / 20)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.shape} density {args.density}, {args.rounds} rounds, medians, ms: "
          + ", ".join(f"{name} {t:.3f}" for name, t in med.items())
          + f"; captured vs eager output max |diff| {diff:.2e} ({p.regime.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
