"""The peers Tessera is measured against, each in the configuration its expert users pick
(``../shared/WORKLOADS.md``), given a Tessera mask: FlexAttention (token-exact: full blocks
where the mask's blocks are the tiles, a mask_mod only on partial tiles), NVIDIA's cuDNN
block-sparse attention and FlashAttention-4 dense, the last two when installed. Every peer's
output is compared with Tessera's (:func:`relative_difference`): one that computes something
else is flagged, not timed. Needs torch."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..mask import BlockMask

__all__ = ["PEER_TOLERANCE", "relative_difference", "agrees", "compiled_flex", "flex_block_mask",
           "flex_kernel_options", "CudnnBsaInputs", "cudnn_bsa_available", "cudnn_bsa_inputs",
           "run_cudnn_bsa", "run_cudnn_bsa_backward", "fa4_available", "FLEX_COMPILES",
           "cudnn_fp8_runs", "run_cudnn_bsa_fp8"]

# A peer whose output differs from Tessera's by more than this (relative, whole tensor) is
# computing another mask or another function: bf16 rounding alone stays near 5e-3.
PEER_TOLERANCE = 2e-2


def relative_difference(a: Any, b: Any) -> float:
    """``|a - b| / |b|`` over whole tensors, in float32."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def agrees(row: dict, name: str, diff: float, what: str) -> bool:
    """Whether a peer's output is within PEER_TOLERANCE of Tessera's (its relative difference
    ``diff``, recorded in ``row`` as ``<name>_diff``); one further away computes something
    else: flagged (``<name>_differs``) and said on stderr (``what`` names the comparison), so
    that it is not timed."""
    row[f"{name}_diff"] = diff
    if diff > PEER_TOLERANCE:
        row[f"{name}_differs"] = True
        print(f"\n{name} differs from Tessera {what} by {diff:.2e}: not timed", file=sys.stderr)
        return False
    return True


def _dense_on(mask: BlockMask, device: Any) -> Any:
    import torch

    d = mask.to_dense()
    return (torch.from_dlpack(d) if mask.on_device else torch.from_numpy(np.asarray(d))).to(device)


def _tile_overlaps(bounds: np.ndarray, tile: int, device: Any) -> Any:
    """[blocks, tiles]: the tokens a block shares with each ``tile``-token tile."""
    import torch

    n_tiles = -(-int(bounds[-1]) // tile)
    t0 = np.arange(n_tiles) * tile
    lo = np.maximum(bounds[:-1, None], t0[None])
    hi = np.minimum(bounds[1:, None], t0[None] + tile)
    return torch.as_tensor(np.maximum(hi - lo, 0), dtype=torch.float32, device=device)


# Compiled Flex programs one process may keep: a length, a head dim, a kernel-tile option or
# a backend each compile their own.
FLEX_COMPILES = 64


def compiled_flex() -> Any:
    """``flex_attention`` compiled for static shapes, as a model with fixed lengths runs it.
    By default a second length makes torch.compile recompile for a symbolic one, and that
    kernel serves every later length more slowly (docs/decisions.md, "FlexAttention compiled
    for static shapes"); ``dynamic=False`` compiles each length its own, up to ``FLEX_COMPILES``."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), FLEX_COMPILES))
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(mask: BlockMask, device: Any, backward: bool = False) -> Any:
    """A FlexAttention BlockMask computing exactly ``mask``. Uniform 64- or 128-token blocks
    are Flex's tiles as they are, all full (no mask_mod, Flex's fastest path: the compiled
    kernel visits only those tiles -- eager Flex, which ignores the block structure, would not
    compute the mask); any other geometry is coarsened to 128-token tiles, those wholly inside
    selected blocks full, the rest partial with a token-exact mask_mod. Without ``backward``
    no query-major lists (``compute_q_blocks=False``: only Flex's backward reads them, and
    they take a vmap, which a custom op's body under torch.compile cannot run)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask as FlexMask

    dense = _dense_on(mask, device)
    uniform = mask.uniform_block_size()
    lists = lambda sel: (sel.sum(-1, dtype=torch.int32),  # noqa: E731
                         torch.argsort(~sel, dim=-1, stable=True).to(torch.int32))
    seq = (mask.seq_len_q, mask.seq_len_kv)
    if uniform is not None and uniform[0] == uniform[1] and uniform[0] in (64, 128):
        n, idx = lists(dense)
        return FlexMask.from_kv_blocks(torch.zeros_like(n), torch.zeros_like(idx), n, idx,
                                       BLOCK_SIZE=uniform[0], seq_lengths=seq,
                                       compute_q_blocks=backward)
    oq = _tile_overlaps(mask.q_bounds, 128, device)
    ok = _tile_overlaps(mask.kv_bounds, 128, device)
    pairs = oq.T @ dense.float() @ ok  # selected token pairs per tile pair
    size = oq.sum(0)[:, None] * ok.sum(0)[None, :]
    full, partial = pairs >= size, (pairs > 0) & (pairs < size)
    qblk = torch.as_tensor(np.repeat(np.arange(mask.num_q_blocks), np.diff(mask.q_bounds)),
                           device=device)
    kblk = torch.as_tensor(np.repeat(np.arange(mask.num_kv_blocks), np.diff(mask.kv_bounds)),
                           device=device)
    B, H = dense.shape[:2]

    def mask_mod(b, h, q_idx, kv_idx):
        return dense[b % B, h % H, qblk[q_idx], kblk[kv_idx]]

    (pn, pi), (fn_, fi) = lists(partial), lists(full)
    return FlexMask.from_kv_blocks(pn, pi, fn_, fi, BLOCK_SIZE=128, mask_mod=mask_mod,
                                   seq_lengths=seq, compute_q_blocks=backward)


def flex_kernel_options(block_mask: Any) -> dict | None:
    """Flex's kernel tiles for a BlockMask: 64x64 for 64-token blocks (its best there, per its
    users), its defaults otherwise."""
    size = block_mask.BLOCK_SIZE
    return {"BLOCK_M": 64, "BLOCK_N": 64} if tuple(size) == (64, 64) else None


def cudnn_bsa_available() -> bool:
    """Whether NVIDIA's cuDNN block-sparse attention (nvidia-cudnn-frontend) is installed."""
    try:  # (finding a submodule imports its package, which may fail to load its libraries)
        return importlib.util.find_spec("cudnn.block_sparse_attention") is not None
    except Exception:
        return False


def fa4_available() -> bool:
    """Whether FlashAttention-4 (flash-attn-4's CuTe kernels, FlexAttention's "FLASH" backend)
    is installed."""
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except Exception:
        return False


@dataclass(frozen=True)
class CudnnBsaInputs:
    """cuDNN BSA's sparse metadata for a mask: per (batch, query head, query block) the
    selected key blocks, first ``nums`` of ``index`` valid.

    Attributes:
        index: int32 ``[B, H, nQB, max selected]``.
        nums: int32 ``[B, H, nQB]``.
        block: the sparse block size (64 or 128).
        kv_splits: its expert setting: "auto" at 64-token blocks, 1 at 128.
    """

    index: Any
    nums: Any
    block: int
    kv_splits: Any


def cudnn_bsa_inputs(mask: BlockMask, batch: int, heads: int, device: Any,
                     kv_heads: int | None = None) -> CudnnBsaInputs | None:
    """cuDNN BSA's metadata for ``mask`` expanded to ``batch`` x ``heads`` query heads (of
    ``kv_heads`` key/value heads), or None where cuDNN BSA cannot run it exactly (blocks other
    than uniform 64 or 128 tokens; a query length not a multiple of 64 at 64-token blocks)."""
    import torch

    uniform = mask.uniform_block_size()
    if uniform is None or uniform[0] != uniform[1] or uniform[0] not in (64, 128):
        return None
    block = uniform[0]
    if block == 64 and mask.seq_len_q % 64:
        return None
    dense = _dense_on(mask, device)
    dense = dense[torch.as_tensor(mask.batch_index(batch), device=device)]
    heads_of = mask.head_index(heads, heads if kv_heads is None else kv_heads)
    dense = dense[:, torch.as_tensor(heads_of, device=device)]
    nums = dense.sum(-1, dtype=torch.int32)
    width = max(int(nums.max()), 1)
    index = torch.argsort(~dense, dim=-1, stable=True)[..., :width].to(torch.int32)
    return CudnnBsaInputs(index.contiguous(), nums.contiguous(), block,
                          "auto" if block == 64 else 1)


def run_cudnn_bsa(q: Any, k: Any, v: Any, inputs: CudnnBsaInputs,
                  return_lse: bool = False) -> Any:
    """cuDNN BSA's forward on ``[B, H, L, D]`` q/k/v with :func:`cudnn_bsa_inputs` (and its
    LSE with ``return_lse``: what its backward reads)."""
    from cudnn.block_sparse_attention import block_sparse_attention_forward

    res = block_sparse_attention_forward(
        q, k, v, inputs.index, q2k_block_nums=inputs.nums, sparse_block_size=inputs.block,
        allow_empty_block_nums=True, layout="bhsd", kv_splits=inputs.kv_splits)
    return (res["o_tensor"], res["lse_tensor"]) if return_lse else res["o_tensor"]


def run_cudnn_bsa_backward(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any,
                           inputs: CudnnBsaInputs) -> tuple[Any, Any, Any]:
    """cuDNN BSA's backward (``block_sparse_attention_backward``: bf16, MHA, head dim 128 on
    sm90) from its own forward's ``out`` and ``lse``: (dq, dk, dv)."""
    from cudnn.block_sparse_attention import block_sparse_attention_backward

    res = block_sparse_attention_backward(
        dout, q, k, v, out, lse, inputs.index, q2k_block_nums=inputs.nums,
        sparse_block_size=inputs.block, layout="bhsd")
    return res["dq_tensor"], res["dk_tensor"], res["dv_tensor"]


def cudnn_fp8_runs(inputs: CudnnBsaInputs | None, seq_len: int, head_dim: int,
                   kv_heads_equal: bool) -> bool:
    """Whether cuDNN's FP8 block-sparse forward (``block_sparse_attention_fp8_forward``, "Sage
    FP8") runs a mask on sm90: MHA bf16 at head dim 128, the length a multiple of the block, and
    every query block selecting the same number of key blocks (sm90 takes no per-row counts:
    top-k masks, not random ones)."""
    if inputs is None or head_dim != 128 or not kv_heads_equal or seq_len % inputs.block:
        return False
    return bool((inputs.nums == inputs.nums.flatten()[0]).all())


def run_cudnn_bsa_fp8(q: Any, k: Any, v: Any, inputs: CudnnBsaInputs) -> Any:
    """cuDNN's FP8 block-sparse forward on bf16 ``[B, H, L, D]`` q/k/v (it quantizes them
    itself) with :func:`cudnn_bsa_inputs`, where :func:`cudnn_fp8_runs`."""
    from cudnn.block_sparse_attention import block_sparse_attention_fp8_forward

    res = block_sparse_attention_fp8_forward(
        q, k, v, inputs.index, block_sparse_num=int(inputs.nums.flatten()[0]),
        sparse_block_size=inputs.block)
    return res["o_tensor"]
