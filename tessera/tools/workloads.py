"""Attention shapes of public video DiTs (Wan, HunyuanVideo, CogVideoX, Mochi) and example masks
of each family at them, for the demo, plots, benchmarks and the profiler's corpus."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import families

__all__ = ["Workload", "WORKLOADS"]


@dataclass(frozen=True)
class Workload:
    """One model's self-attention: heads x head dim over a latent video grid plus text slots."""

    name: str
    heads: int
    head_dim: int
    latent: tuple[int, int, int]  # frames, height, width of the latent token grid
    text_tokens: int = 0  # text slots inside self-attention (0: text via cross-attention)
    text_valid: int = 0  # how many of those slots a typical prompt fills

    @property
    def video_tokens(self) -> int:
        return math.prod(self.latent)

    @property
    def seq_len(self) -> int:
        return self.video_tokens + self.text_tokens


WORKLOADS = {w.name: w for w in (
    Workload("wan-1.3b-480p", 12, 128, (21, 30, 52)),
    Workload("wan-14b-720p", 40, 128, (21, 45, 80)),
    Workload("hunyuan-720p", 24, 128, (33, 45, 80), 256, 100),
    Workload("cogvideox-5b", 48, 64, (13, 30, 45), 226, 226),
    Workload("cogvideox-2b", 30, 64, (13, 30, 45), 226, 226),
    Workload("mochi-1", 24, 128, (28, 30, 53), 256, 100),
)}


FAMILIES = ("sliding_tile", "spatial_temporal", "radial", "topk_pooled", "semantic_clusters",
            "random_blocks", "mixed_density")
STA_WINDOWS = [(3, 3, 3), (1, 5, 7), (3, 1, 10)]  # per-head windows, cycled over the heads


def example_mask(workload: Workload, family: str, heads: int | None = None, seed: int = 0,
                 head_dim: int = 64):
    """A mask of ``family`` at typical parameters for ``workload`` (``tessera.families``).

    Data-dependent families (top-k, clusters) pool random normal q and k of ``head_dim`` on the
    host: their density, not their meaning, is what a plan or a benchmark needs.
    """
    heads = workload.heads if heads is None else heads
    text = dict(text_tokens=workload.text_tokens, text_valid=workload.text_valid or None)
    lat = workload.latent
    if family == "sliding_tile":
        return families.sliding_tile(lat, window=[STA_WINDOWS[h % 3] for h in range(heads)], **text)
    if family == "spatial_temporal":
        return families.spatial_temporal(lat, heads=["spatial", "temporal"] * (heads // 2)
                                      + ["spatial"] * (heads % 2), **text)
    if family == "radial":
        return families.radial(lat, **text)
    if family == "random_blocks":
        return families.random_blocks(heads, workload.seq_len, density=0.1, seed=seed, **text)
    if family == "mixed_density":  # heads from 2% to 60% of the blocks, as a model's differ
        return families.random_blocks(heads, workload.seq_len, seed=seed,
                                      density=families.mixed_densities(heads, seed), **text)
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((heads, workload.seq_len, head_dim), dtype=np.float32)
            for _ in range(2))
    if family == "topk_pooled":
        n_cubes = math.prod(-(-a // 4) for a in lat)
        return families.topk_pooled(q, k, lat, topk=max(1, round(0.1 * n_cubes)), **text)
    if family == "semantic_clusters":
        n = max(2, workload.seq_len // 128)
        return families.semantic_clusters(q, k, n, n, seed=seed, **text)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
