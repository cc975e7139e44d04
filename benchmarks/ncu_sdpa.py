"""Run torch's dense SDPA on a model shape with one backend, for ``ncu`` to profile next to
Tessera's kernels (benchmarks/ncu_one.py).

``ncu -k regex:flash_fwd --launch-skip 2 --launch-count 1 python benchmarks/ncu_sdpa.py
[flash | cudnn] [shape]`` (shape: a ``tessera.workloads`` name, Wan-2.1-1.3B by default)
"""

import sys


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tessera.workloads import WORKLOADS

    backend = {"flash": SDPBackend.FLASH_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[sys.argv[1] if len(sys.argv) > 1 else "flash"]
    w = WORKLOADS[sys.argv[2] if len(sys.argv) > 2 else "wan-1.3b-480p"]
    q, k, v = (torch.randn(1, w.heads, w.seq_len, w.head_dim, device="cuda",
                           dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(backend):
        for _ in range(4):
            F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
