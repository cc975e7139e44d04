"""Attention shapes of public video DiTs (../shared/WORKLOADS.md), for demos, plots and benchmarks."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
