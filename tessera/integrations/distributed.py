"""Sequence-parallel block-sparse attention across the ranks of a torch.distributed group.

Every rank holds a contiguous shard of the sequence (``shard_ranges``: the tokens split as evenly
as they go, the first ranks one longer) of q, k and v, and the whole logical mask; each gets its
shard of the output. Two ways to get there, both on torch.distributed's point-to-point
operations (NCCL on GPUs, gloo on CPUs; no communication layer of our own):

* **Ulysses** (``mode="ulysses"``): an all-to-all turns sequence shards into head shards, each
  rank runs whole-sequence attention for its heads, and a second all-to-all turns the output
  back. The heads go to ranks by their *useful pairs* (the mask's work per head), not their
  count: sparse masks differ per head by an order of magnitude. Any head count works.
* **Ring** (``mode="ring"``): queries stay; at step ``s`` rank ``r`` gets the key/value shard of
  rank ``r - s`` and runs attention on the part of the mask between its queries and those keys,
  merging partial outputs by their log-sum-exp. A shard that a rank's queries never select is
  neither sent to it nor computed, and the next step's transfer is issued before the current
  step's attention, so communication overlaps compute.

* **Hybrid** (``mode="hybrid"``, ``ulysses_degree=U``): Ulysses inside groups of ``U``
  consecutive ranks (one node's GPUs: the all-to-alls stay on its links), the ring across the
  groups, each rank for its heads.

``mode="auto"`` (:func:`choose_mode`) takes Ulysses when there are at least as many kv heads as
ranks, else the hybrid with the largest Ulysses group the kv heads allow, else the ring. On
CUDA tensors the local attention is ``tessera.attention``; on CPU tensors the float64
reference (tests). The schedule is made at every call from the mask where it is: a device
mask's parts (heads, shard pairs) are cut and planned on its GPU; only per-head work and which
shards are needed come back to the host (a few small reads).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._array import to_numpy
from ..mask import BlockMask
from . import torch_attention

__all__ = ["sequence_parallel_attention", "shard_ranges", "assign_heads", "crop", "RingPlan",
           "ring_plan", "choose_mode", "head_units", "rank_pairs", "MODES", "BALANCES"]

MODES = ("auto", "ulysses", "ring", "hybrid")
BALANCES = ("pairs", "heads")


def shard_ranges(length: int, ranks: int) -> list[tuple[int, int]]:
    """The token range ``[start, end)`` each rank holds: as even as it goes, the first
    ``length % ranks`` ranks one token longer."""
    _positive_int("ranks", ranks)
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    base, extra = divmod(length, ranks)
    ends = np.cumsum([base + (r < extra) for r in range(ranks)])
    return [(int(e - base - (r < extra)), int(e)) for r, e in enumerate(ends)]


def _dense_per_head(mask: BlockMask, num_q_heads: int, num_kv_heads: int) -> Any:
    """The block matrix ``[B_mask, Hq, nQB, nKB]``, one per query head, where the mask is (a
    device mask's stays on its GPU: the parts cut from it are planned there)."""
    xp = mask.xp
    return mask.to_dense()[:, xp.asarray(mask.head_index(num_q_heads, num_kv_heads))]


def _positive_int(name: str, x: Any) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{name} must be an int >= 1, got {x!r}")


def _check_ulysses_degree(ulysses_degree: Any, ranks: int, kv_heads: int) -> None:
    """A Ulysses group size must divide the ranks and give every rank of a group a kv head."""
    if (isinstance(ulysses_degree, bool) or not isinstance(ulysses_degree, (int, np.integer))
            or ulysses_degree < 1 or ranks % ulysses_degree or ulysses_degree > kv_heads):
        raise ValueError(f"ulysses_degree must divide the group's {ranks} ranks and be at "
                         f"most the {kv_heads} kv heads, got {ulysses_degree!r}")


def _any(x: Any) -> bool:
    """Whether a (host or device) boolean array holds a True: one small read back."""
    return bool(x.any())


def assign_heads(work: Sequence[float], ranks: int) -> list[list[int]]:
    """Units (heads, or kv-head groups) to ranks so that the most loaded rank's work is small:
    longest first to the least loaded rank, then single moves and pairwise swaps while they
    lower the maximum. Returns each rank's units, sorted."""
    _positive_int("ranks", ranks)
    try:
        work = np.asarray(work, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"work must be a sequence of numbers, got {work!r}") from None
    if work.ndim != 1 or not np.all(np.isfinite(work)) or np.any(work < 0):
        raise ValueError(f"work must be a 1-D sequence of finite numbers >= 0, got {work!r}")
    owner = np.zeros(work.size, dtype=np.int64)
    load = np.zeros(ranks)
    for u in np.argsort(-work, kind="stable"):
        r = int(np.argmin(load))
        owner[u] = r
        load[r] += work[u]
    while (step := _better_move(work, owner, load)) is not None:
        u, r, v = step
        top = owner[u]
        wv = 0.0 if v is None else work[v]
        owner[u] = r
        if v is not None:
            owner[v] = top
        load[top] += wv - work[u]
        load[r] += work[u] - wv
    return [sorted(np.flatnonzero(owner == r).tolist()) for r in range(ranks)]


def _better_move(work: np.ndarray, owner: np.ndarray,
                 load: np.ndarray) -> tuple[int, int, int | None] | None:
    """A unit ``u`` of the busiest rank to move to rank ``r`` -- in exchange for ``r``'s unit
    ``v``, or for nothing -- that lowers the largest load; None when no such step exists (each
    step lowers it, so repeating them ends)."""
    top = int(np.argmax(load))
    for u in np.flatnonzero(owner == top):
        for r in range(load.size):
            if r == top:
                continue
            others = np.delete(load, [top, r]).max(initial=0.0)
            for v in [None, *np.flatnonzero(owner == r)]:
                wv = 0.0 if v is None else work[v]
                if max(load[top] - work[u] + wv, load[r] + work[u] - wv, others) < \
                        load[top] - 1e-9:
                    return int(u), r, None if v is None else int(v)
    return None


def crop(mask: BlockMask, q_range: tuple[int, int], kv_range: tuple[int, int],
         dense: Any = None) -> BlockMask | None:
    """The part of ``mask`` between query tokens ``q_range`` and key tokens ``kv_range``, as a
    mask of its own (blocks clipped to the ranges, empty ones dropped); None when it selects
    nothing. ``dense``: the mask's block matrix (where the mask is), when the caller has it."""
    d = mask.to_dense() if dense is None else dense
    xp = mask.xp

    def clip(bounds: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = np.clip(bounds[:-1], lo, hi), np.clip(bounds[1:], lo, hi)
        keep = np.flatnonzero(b > a)
        return keep, np.r_[a[keep] - lo, b[keep][-1:] - lo] if keep.size else np.zeros(1, int)

    qi, qb = clip(mask.q_bounds, *q_range)
    ki, kb = clip(mask.kv_bounds, *kv_range)
    if not qi.size or not ki.size:
        return None
    part = d[..., xp.asarray(qi), :][..., xp.asarray(ki)]
    if not _any(part):
        return None
    return BlockMask.from_dense(part, q_bounds=qb.astype(np.int64), kv_bounds=kb.astype(np.int64))


@dataclass(frozen=True)
class RingPlan:
    """Which key/value shards each rank's queries need (``needed[r, j]``), and the steps.

    Attributes:
        needed: bool ``[P, P]``.
        skipped_fraction: the share of the ring's ``P * P`` (rank, shard) steps that neither
            move nor compute anything.
    """

    needed: np.ndarray

    @property
    def skipped_fraction(self) -> float:
        return float(1.0 - self.needed.mean())


def ring_plan(mask: BlockMask, ranges: list[tuple[int, int]], dense: Any) -> RingPlan:
    """The shards each rank's queries select (any pair in the block matrix ``dense``, host or
    device)."""
    p = len(ranges)
    needed = np.zeros((p, p), dtype=bool)
    qb, kb = mask.q_bounds, mask.kv_bounds
    sel = to_numpy(dense.any(axis=(0, 1)))  # [nQB, nKB]: selected in some batch and head
    for r, (q0, q1) in enumerate(ranges):
        rows = (qb[1:] > q0) & (qb[:-1] < q1)
        for j, (k0, k1) in enumerate(ranges):
            cols = (kb[1:] > k0) & (kb[:-1] < k1)
            needed[r, j] = bool(sel[np.ix_(rows, cols)].any()) and q1 > q0 and k1 > k0
    return RingPlan(needed)


# ---- the distributed calls ---------------------------------------------------------------
def _local(q: Any, k: Any, v: Any, mask: BlockMask, layout: str, scale: float | None):
    """Attention with its LSE (Tessera on CUDA tensors, the reference on CPU ones)."""
    return torch_attention.attention(q, k, v, mask, layout=layout, scale=scale,
                                     return_lse=True)


def _exchange(sends: list[Any], recv_shapes: list[tuple | None], like: Any, group: Any,
              rank: int) -> tuple[list[Any], list[Any]]:
    """Point-to-point: ``sends[j]`` (or None) to group rank ``j``, a tensor of
    ``recv_shapes[j]`` (or nothing) from each; returns (received, pending work)."""
    import torch
    import torch.distributed as dist

    recvs: list[Any] = [None] * len(recv_shapes)
    ops = []
    for j, shape in enumerate(recv_shapes):
        if shape is None:
            continue
        if j == rank:
            recvs[j] = sends[j]
            continue
        recvs[j] = torch.empty(shape, dtype=like.dtype, device=like.device)
        ops.append(dist.P2POp(dist.irecv, recvs[j], dist.get_global_rank(group, j)
                              if group is not None else j, group))
    for j, t in enumerate(sends):
        if t is not None and j != rank:
            ops.append(dist.P2POp(dist.isend, t.contiguous(), dist.get_global_rank(group, j)
                                  if group is not None else j, group))
    works = dist.batch_isend_irecv(ops) if ops else []
    return recvs, works


def _seq_dim(layout: str) -> int:
    return 2 if layout == "bhld" else 1


def _head_dim(layout: str) -> int:
    return 1 if layout == "bhld" else 2


def head_units(mask: BlockMask, dense: Any, num_kv_heads: int, ranks: int,
               balance: str = "pairs") -> list[list[int]]:
    """The kv heads (with their query heads) each of ``ranks`` ranks computes under Ulysses:
    balanced by useful pairs (``balance="pairs"``, :func:`assign_heads`) or split by count in
    consecutive runs (``"heads"``, the plain split, as dense sequence-parallel stacks do).
    ``dense``: the per-query-head block matrix (host or device)."""
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
    _positive_int("num_kv_heads", num_kv_heads)
    _positive_int("ranks", ranks)
    if balance == "heads":
        bounds = [r * num_kv_heads // ranks for r in range(ranks + 1)]
        return [list(range(bounds[r], bounds[r + 1])) for r in range(ranks)]
    g = dense.shape[1] // num_kv_heads
    return assign_heads(_pairs_per_head(mask, dense).reshape(num_kv_heads, g).sum(1), ranks)


def _ulysses(q, k, v, mask, dense, ranges, rank, ranks, layout, scale, group, inner=None,
             balance="pairs"):
    """Ulysses over ``group`` (whose ranks hold ``ranges``, consecutive, of one token span):
    heads in, whole-span attention (``inner(q, k, v, heads, mask, dense)`` when given: the
    hybrid's ring across spans), heads out."""
    import torch

    sd, hd = _seq_dim(layout), _head_dim(layout)
    hq, hkv = q.shape[hd], k.shape[hd]
    g = hq // hkv
    units = head_units(mask, dense, hkv, ranks, balance)
    qheads = [[u * g + i for u in us for i in range(g)] for us in units]

    def pick(x, heads):
        return x.index_select(hd, torch.as_tensor(heads, dtype=torch.long, device=x.device))

    def gathered(x, heads_of, rank_heads):
        """Send my shard of each rank's heads; receive every rank's shard of mine."""
        sends = [pick(x, heads_of[j]) if heads_of[j] else None for j in range(ranks)]
        shape = list(x.shape)
        shape[hd] = len(rank_heads)
        shapes = []
        for j in range(ranks):
            s = list(shape)
            s[sd] = ranges[j][1] - ranges[j][0]
            shapes.append(tuple(s) if rank_heads else None)
        recvs, works = _exchange(sends, shapes, x, group, rank)
        for w in works:
            w.wait()
        return torch.cat([r for r in recvs if r is not None], dim=sd) if rank_heads else None

    mine_q, mine_kv = qheads[rank], units[rank]
    full_q = gathered(q, qheads, mine_q)
    full_k = gathered(k, units, mine_kv)
    full_v = gathered(v, units, mine_kv)
    out_mine = None
    if inner is not None:
        out_mine = inner(full_q, full_k, full_v, mine_q)
    elif mine_q:
        sub = _subset(mask, _head_part(mask, dense, mine_q))
        if sub is None:  # my heads select nothing: zero output
            out_mine = torch.zeros_like(full_q)
        else:
            out_mine = _local(full_q, full_k, full_v, sub, layout, scale)[0]
    # back: my heads' output, split by sequence shard, to each shard's owner
    base = ranges[0][0]
    sends = [out_mine.narrow(sd, ranges[j][0] - base, ranges[j][1] - ranges[j][0])
             if out_mine is not None else None for j in range(ranks)]
    shapes = []
    for j in range(ranks):
        s = list(q.shape)
        s[hd] = len(qheads[j])
        shapes.append(tuple(s) if qheads[j] else None)
    recvs, works = _exchange(sends, shapes, q, group, rank)
    for w in works:
        w.wait()
    out = torch.empty_like(q)
    for j in range(ranks):
        if qheads[j]:
            idx = torch.as_tensor(qheads[j], dtype=torch.long, device=q.device)
            out.index_copy_(hd, idx, recvs[j].to(q.dtype))
    return out


def _pairs_per_head(mask: BlockMask, dense: Any) -> np.ndarray:
    """Useful (query, key) pairs per query head of the per-head block matrix ``dense`` (host
    or device; the answer on the host)."""
    xp = mask.xp
    rq = xp.asarray(np.diff(mask.q_bounds), dtype=xp.float64)
    rk = xp.asarray(np.diff(mask.kv_bounds), dtype=xp.float64)
    return to_numpy((dense.astype(xp.float64) @ rk) @ rq).sum(axis=0)


def _head_part(mask: BlockMask, dense: Any, heads: list[int]) -> Any:
    """The query heads ``heads`` of the per-head block matrix ``dense`` (where it is)."""
    return dense[:, mask.xp.asarray(heads, dtype=np.int64)]


def _subset(mask: BlockMask, part: Any) -> BlockMask | None:
    """``mask``'s geometry over the block matrix ``part``; None when it selects nothing."""
    if not _any(part):
        return None
    return BlockMask.from_dense(part, q_bounds=mask.q_bounds, kv_bounds=mask.kv_bounds)


def _ring(q, k, v, mask, dense, ranges, rank, ranks, layout, scale, group):
    import torch

    sd = _seq_dim(layout)
    plan = ring_plan(mask, ranges, dense)
    out_acc = lse_acc = None

    mine = torch.cat([k, v], dim=0)  # one transfer for both

    def post(step):
        """Step ``step``'s transfers: my k/v to rank + step if its queries need them, rank -
        step's to me if mine do (both sides read the same plan, so every send has its
        receive)."""
        frm = (rank - step) % ranks
        if step == 0:
            return frm, (mine if plan.needed[rank, rank] else None), []
        to = (rank + step) % ranks
        sends, shapes = [None] * ranks, [None] * ranks
        if plan.needed[to, rank]:
            sends[to] = mine
        if plan.needed[rank, frm]:
            s = list(mine.shape)
            s[sd] = ranges[frm][1] - ranges[frm][0]
            shapes[frm] = tuple(s)
        recvs, works = _exchange(sends, shapes, k, group, rank)
        return frm, recvs[frm], works

    pending = post(0)
    for step in range(ranks):
        frm, kv, works = pending
        if step + 1 < ranks:
            pending = post(step + 1)  # the next shard moves while this one is computed
        for w in works:
            w.wait()
        if kv is None:
            continue
        kj, vj = kv.chunk(2, dim=0)
        sub = crop(mask, ranges[rank], ranges[frm], dense)
        if sub is None:
            continue
        o, lse = _local(q, kj, vj, sub, layout, scale)
        o = o.float() if layout == "bhld" else o.float().transpose(1, 2)  # [B, H, Lq, D]
        if out_acc is None:
            out_acc, lse_acc = o, lse
            continue
        m = torch.maximum(lse_acc, lse)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        a, b = torch.exp(lse_acc - m), torch.exp(lse - m)
        total = a + b
        safe = torch.where(total > 0, total, torch.ones_like(total))
        out_acc = (out_acc * a[..., None] + o * b[..., None]) / safe[..., None]
        lse_acc = torch.where(total > 0, m + torch.log(safe), lse_acc)
    if out_acc is None:
        return torch.zeros_like(q)
    return (out_acc if layout == "bhld" else out_acc.transpose(1, 2)).to(q.dtype).contiguous()


_joined: set[int] = set()  # groups whose ranks have met once


_hybrid_groups: dict[tuple[int, int], tuple[Any, Any]] = {}


def _subgroups(group: Any, ulysses_degree: int) -> tuple[Any, Any]:
    """This rank's Ulysses group (``ulysses_degree`` consecutive ranks: one node's GPUs) and
    ring group (the ranks at the same place in every Ulysses group), made once per group.
    Every rank makes every subgroup, in one order, as torch.distributed requires."""
    import torch.distributed as dist

    key = (id(group), ulysses_degree)
    if key not in _hybrid_groups:
        ranks = dist.get_world_size(group)
        glob = [dist.get_global_rank(group, r) if group is not None else r
                for r in range(ranks)]
        me = dist.get_rank(group)
        u_groups = [dist.new_group(glob[i:i + ulysses_degree])
                    for i in range(0, ranks, ulysses_degree)]
        r_groups = [dist.new_group(glob[u::ulysses_degree]) for u in range(ulysses_degree)]
        _hybrid_groups[key] = (u_groups[me // ulysses_degree], r_groups[me % ulysses_degree])
    return _hybrid_groups[key]


def _hybrid(q, k, v, mask, dense, ranges, rank, ranks, layout, scale, group, ulysses_degree,
            balance="pairs"):
    """Ulysses inside groups of ``ulysses_degree`` consecutive ranks (each group holds one
    contiguous span of the sequence), then the ring across the groups for each rank's heads,
    then Ulysses back."""
    import torch

    u = ulysses_degree
    u_group, r_group = _subgroups(group, u)
    g0 = rank // u * u
    spans = [(ranges[i][0], ranges[i + u - 1][1]) for i in range(0, ranks, u)]

    def ring_for(fq, fk, fv, heads):
        if not heads:
            return None
        mine = _head_part(mask, dense, heads)
        sub = _subset(mask, mine)
        if sub is None:
            return torch.zeros_like(fq)
        return _ring(fq, fk, fv, sub, mine, spans, rank // u, ranks // u, layout, scale, r_group)

    return _ulysses(q, k, v, mask, dense, ranges[g0:g0 + u], rank % u, u, layout, scale,
                    u_group, inner=ring_for, balance=balance)


def sequence_parallel_attention(q: Any, k: Any, v: Any, block_mask: BlockMask, *,
                                group: Any = None, mode: str = "auto", layout: str = "bhld",
                                scale: float | None = None,
                                ulysses_degree: int | None = None,
                                balance: str = "pairs") -> Any:
    """This rank's shard of block-sparse attention over the whole sequence: ``q``/``k``/``v``
    are this rank's contiguous sequence shard (:func:`shard_ranges` of the mask's length over
    the group), ``[B, H, L_shard, D]`` or ``[B, L_shard, H, D]``; ``block_mask`` the whole
    sequence's, the same on every rank. Returns this rank's output shard (q's layout and
    dtype). ``mode``: "ulysses", "ring", "hybrid" (Ulysses inside groups of
    ``ulysses_degree`` consecutive ranks, the ring across them) or "auto" (see the module
    docstring). ``balance``: how Ulysses gives heads to ranks, by useful pairs ("pairs") or
    by count ("heads", the plain split: for comparison)."""
    import torch
    import torch.distributed as dist

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
    if mode == "hybrid" and ulysses_degree is None:
        raise ValueError("mode='hybrid' needs ulysses_degree (the ranks of one Ulysses group)")
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got "
                        f"{type(block_mask).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise TypeError(f"{name} must be a 4-D torch tensor, got {type(x).__name__}"
                            f"{'' if not hasattr(x, 'shape') else tuple(x.shape)}")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group first")
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    key = id(group)
    if key not in _joined:
        # Once per group, every rank together: NCCL sets up a group's communicator at its
        # first operation, which must then involve every rank (point-to-point ones may not).
        dist.barrier(group=group)
        _joined.add(key)
    if block_mask.seq_len_q != block_mask.seq_len_kv:
        raise ValueError("sequence parallelism needs self-attention (seq_len_q == seq_len_kv), "
                         f"got {block_mask.seq_len_q} and {block_mask.seq_len_kv}")
    ranges = shard_ranges(block_mask.seq_len_q, ranks)
    sd, hd = _seq_dim(layout), _head_dim(layout)
    want = ranges[rank][1] - ranges[rank][0]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.shape[sd] != want:
            raise ValueError(f"{name} holds {x.shape[sd]} tokens; rank {rank} of {ranks} holds "
                             f"tokens {ranges[rank][0]}..{ranges[rank][1]} of the mask's "
                             f"{block_mask.seq_len_q} ({want})")
    hq, hkv = q.shape[hd], k.shape[hd]
    if hq % hkv:
        raise ValueError(f"q heads {hq} must be a multiple of k heads {hkv}")
    if ulysses_degree is not None:
        _check_ulysses_degree(ulysses_degree, ranks, hkv)
    dense = _dense_per_head(block_mask, hq, hkv)
    if mode == "auto":
        mode, ulysses_degree = choose_mode(ranks, hkv)
    args = (q, k, v, block_mask, dense, ranges, rank, ranks, layout, scale, group)
    if mode == "hybrid":
        return _hybrid(*args, ulysses_degree, balance)
    if mode == "ulysses":
        return _ulysses(*args, balance=balance)
    return _ring(*args)


def rank_pairs(block_mask: BlockMask, ranks: int, num_q_heads: int, num_kv_heads: int, *,
               mode: str, ulysses_degree: int | None = None,
               balance: str = "pairs") -> np.ndarray:
    """The useful (query, key) pairs each rank computes under ``mode`` (not "auto"): the work
    balance that :func:`sequence_parallel_attention` gets, per rank, from the mask alone."""
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got "
                        f"{type(block_mask).__name__}")
    if mode not in ("ulysses", "ring", "hybrid"):
        raise ValueError(f"mode must be 'ulysses', 'ring' or 'hybrid', got {mode!r}")
    for name, x in (("ranks", ranks), ("num_q_heads", num_q_heads),
                    ("num_kv_heads", num_kv_heads)):
        _positive_int(name, x)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} must be a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    if mode == "hybrid":
        if ulysses_degree is None:
            raise ValueError("mode='hybrid' needs ulysses_degree (the ranks of one Ulysses "
                             "group)")
        _check_ulysses_degree(ulysses_degree, ranks, num_kv_heads)
    dense = _dense_per_head(block_mask, num_q_heads, num_kv_heads)
    ranges = shard_ranges(block_mask.seq_len_q, ranks)
    g = num_q_heads // num_kv_heads
    qb = block_mask.q_bounds
    # [Hq, nQB]: each head's pairs per query block, on the host (one small read back)
    rk = block_mask.xp.asarray(np.diff(block_mask.kv_bounds), dtype=np.float64)
    per_row = to_numpy(dense.astype(np.float64) @ rk).sum(axis=0)

    def rows_in(lo: int, hi: int) -> np.ndarray:  # query tokens of each block inside [lo, hi)
        return np.clip(np.minimum(qb[1:], hi) - np.maximum(qb[:-1], lo), 0, None).astype(
            np.float64)

    def pairs(heads: list[int], lo: int, hi: int) -> float:
        if not heads:
            return 0.0
        return float(per_row[heads].sum(axis=0) @ rows_in(lo, hi))

    if mode == "ring":
        return np.array([pairs(list(range(num_q_heads)), *r) for r in ranges])
    # Ulysses: each rank's heads over the whole sequence; the hybrid: over its group's span
    # (the ring brings every key to it). Either way the heads are assigned by the whole mask.
    u = ranks if mode == "ulysses" else ulysses_degree
    units = head_units(block_mask, dense, num_kv_heads, u, balance)
    out = np.zeros(ranks)
    for g0 in range(0, ranks, u):
        span = (ranges[g0][0], ranges[g0 + u - 1][1])
        for i, us in enumerate(units):
            out[g0 + i] = pairs([x * g + j for x in us for j in range(g)], *span)
    return out


def choose_mode(ranks: int, kv_heads: int) -> tuple[str, int | None]:
    """``mode="auto"``: Ulysses when every rank can have a kv head (no ring steps at all);
    else the hybrid with the largest Ulysses group the heads allow (all-to-alls inside it, the
    ring across fewer, larger spans); the ring alone when no group larger than one fits."""
    _positive_int("ranks", ranks)
    _positive_int("kv_heads", kv_heads)
    if kv_heads >= ranks:
        return "ulysses", None
    u = max(d for d in range(1, ranks + 1) if ranks % d == 0 and d <= kv_heads)
    return ("hybrid", u) if u > 1 else ("ring", None)


def brute_force_assignment(work: Sequence[float], ranks: int) -> float:
    """The smallest possible maximum load (every assignment tried; small cases, for tests)."""
    work = list(work)
    best = float("inf")
    for owners in itertools.product(range(ranks), repeat=len(work)):
        load = np.zeros(ranks)
        for w, o in zip(work, owners):
            load[o] += w
        best = min(best, float(load.max()))
    return best
