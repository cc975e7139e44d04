"""``python -m tessera bench``: Tessera against dense SDPA (cuDNN, flash) and FlexAttention with
a per-request BlockMask, in one process, on the WORKLOADS shapes and mask families.

Two kinds of masks: ``--case`` (random, top-k or banded masks on uniform 128- or 64-token
blocks, :data:`CASES`) and ``--family``
(the :mod:`tessera.families` families at their typical parameters,
:func:`tessera.tools.workloads.example_mask`), whose blocks need not be 128-token aligned
(64-token cubes, variable clusters). Every peer runs at its best on the exact mask
(:mod:`tessera.tools.peers`): FlexAttention with the blocks as full tiles where they are 64 or
128 tokens (64x64 kernel tiles at 64), else 128-token tiles with a token-exact mask_mod on the
partial ones; cuDNN's block-sparse attention (when installed) on uniform 64- or 128-token
blocks; FlashAttention-4 dense (when installed) on the dense case. Each peer's output is
compared with Tessera's first, and one that differs is flagged, not timed.

Useful FLOPs = 4 * D * selected (query, key) pairs. "kernel" = the GPU time of one run of a
prepared plan (FlexAttention: of its compiled call with a ready BlockMask; SDPA: of one call),
measured over :data:`BURST` calls between two events so that the host's launch work hides
behind the GPU's as it does in a model, Tessera's and every peer's kernel in the same
interleaved rounds (``--rounds``; the median of each reported): timed one after the other, each
would read what ran before it (docs/benchmarking.md). "call" = one such call timed alone, the
host's launch work included.
"request" = everything a dynamic-mask call costs: building the mask object from a device bool
block matrix, planning and running (FlexAttention: building its BlockMask and running), timed
alone (the host's work and the GPU's add up) and back to back ("b2b": :data:`BURST` requests
between two events, as a model's layer loop issues them -- the host's work hides behind the
GPU's unless something makes the host wait for the GPU). Needs a GPU and PyTorch (the baselines
and the timers); prints a table and can write JSON and a PNG chart.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import tessera

from ..cuda.device import device_cc
from ..families.common import variable_bounds
from ..quantize_launch import PRECISION_SCHEMES
from ..runtime.regime import regime_from_name
from .args import positive_int, require_matplotlib
from . import bench_backward, bench_distributed, bench_int8, peers
from .timing import cuda_time_ms, interleaved_ms
from .workloads import FAMILIES, WORKLOADS, example_mask

# Calls per pair of events in the kernel and back-to-back timings.
BURST = 10


def _band(n: int, heads: int, width: int) -> np.ndarray:
    i = np.arange(n)
    return np.broadcast_to(np.abs(i[:, None] - i[None, :]) <= width, (heads, n, n)).copy()


def _top_k(rng: np.random.Generator, heads: int, n: int, density: float) -> np.ndarray:
    """The same number of key blocks for every query block, at random (a top-k selection's
    shape, whatever scored the blocks)."""
    k = max(1, round(density * n))
    order = np.argsort(rng.random((heads, n, n)), axis=-1)[..., :k]
    out = np.zeros((heads, n, n), bool)
    np.put_along_axis(out, order, True, axis=-1)
    return out


@dataclass(frozen=True)
class Case:
    """A mask case: ``block`` tokens a block, ``make(rng, heads, blocks)`` its block matrix.
    128 is FlexAttention's default tile; 64 the block of VSA-style top-k methods, where the
    length is padded to whole blocks as those methods' users pad it (cuDNN's 64-token kernels
    need it). ``sizes``: variable blocks instead, each of a size drawn uniformly from that
    range (the same blocks for queries and keys, as clusters give), ``block`` their mean."""

    block: int
    make: Callable[[np.random.Generator, int, int], np.ndarray]
    sizes: tuple[int, int] | None = None

    def bounds(self, seq_len: int) -> np.ndarray:
        """Token bounds of a uniform case's blocks over ``seq_len`` tokens (its last one the
        length it runs at): blocks under 128 tokens pad the length to whole blocks."""
        n = math.ceil(seq_len / self.block)
        length = n * self.block if self.block < 128 else seq_len
        return np.minimum(np.arange(n + 1) * self.block, length)


CASES: dict[str, Case] = {
    "random-10": Case(128, lambda rng, h, n: rng.random((h, n, n)) < 0.10),
    "random-30": Case(128, lambda rng, h, n: rng.random((h, n, n)) < 0.30),
    "band-16": Case(128, lambda rng, h, n: _band(n, h, int(0.08 * n))),
    "dense": Case(128, lambda rng, h, n: np.ones((h, n, n), bool)),
    "topk64-10": Case(64, lambda rng, h, n: _top_k(rng, h, n, 0.10)),
    "random64-30": Case(64, lambda rng, h, n: rng.random((h, n, n)) < 0.30),
    "variable-10": Case(144, lambda rng, h, n: rng.random((h, n, n)) < 0.10, sizes=(32, 256)),
    # heads from 2% to 60% of the blocks (families.mixed_densities), as spatial and temporal
    # heads differ: where the slowest heads' tail and per-head tiles show (the distributed
    # bench's case, one maker for both)
    "mixed-heads": Case(128, lambda rng, h, n: bench_distributed.case_blocks("mixed-heads", rng,
                                                                             h, n)),
}


def _progress(i: int, n: int, label: str) -> None:
    width = 30
    done = int(width * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {label:40}")
    sys.stderr.flush()
    if i == n:
        sys.stderr.write("\n")


def case_blocks(shape: str, case: str, heads: int, rng: np.random.Generator | None = None):
    """A mask of ``case`` (a name of :data:`CASES` or a mask family) for ``shape`` with
    ``heads`` query heads: (bool block matrix on the GPU, q bounds, kv bounds); a uniform case
    of blocks under 128 tokens runs at the length padded to whole blocks (``bounds[-1]``)."""
    import torch  # noqa: PLC0415

    rng = np.random.default_rng(0) if rng is None else rng
    L = WORKLOADS[shape].seq_len
    if case in CASES:
        c = CASES[case]
        qb = kb = variable_bounds(rng, L, *c.sizes) if c.sizes is not None else c.bounds(L)
        return torch.from_numpy(c.make(rng, heads, qb.size - 1)).cuda(), qb, kb
    host, qb, kb = _family_blocks(shape, case, heads)
    return torch.from_numpy(host).cuda(), qb, kb


def _family_blocks(shape: str, family: str, heads: int, seed: int = 0):
    """A family mask for ``shape`` as (host bool block matrix [H', nQB, nKB] with H' = 1 or
    ``heads``, q bounds, kv bounds) — what a sparse-attention method hands over each step."""

    w = WORKLOADS[shape]
    m = example_mask(w, family, heads=heads, seed=seed, head_dim=w.head_dim).mask
    return m.to_dense()[0], m.q_bounds, m.kv_bounds


def run(shapes: list[str], cases: list[str], reps: int = 20, flex: bool = True,
        batch: int = 1, heads: int | None = None, regime: Any = None,
        rounds: int = 8, sdpa: bool = True, host_mask: bool = False) -> list[dict]:
    """Time every (shape, case); returns one dict of figures per pair. A case is a name of
    :data:`CASES` or of a mask family (:data:`tessera.tools.workloads.FAMILIES`). ``heads``
    (default: the model's) slices the model's query heads, e.g. to keep host-built family
    masks quick. ``regime`` (a ``tessera.Regime``) replaces the one Tessera would pick, for
    every case. The kernels (Tessera's and the peers') are timed in ``rounds`` interleaved
    rounds (:func:`~tessera.tools.timing.interleaved_ms`; a row's ``rounds_ms`` lists them),
    the host-inclusive figures over ``reps`` timings each. ``sdpa=False`` leaves out the dense
    SDPA baselines (each a hundred dense calls: the longest part of a run at 100k+ tokens).
    ``host_mask``: Tessera plans a host copy of each mask (the general planner, as for a mask
    built with numpy) instead of the device mask (the planner kernels); both plans count the
    mask's blocks, so a dense layer walks whole spans and fills its last wave either way, while
    the request figures plan as requests do, counting nothing."""
    if reps < 1 or rounds < 1:
        raise ValueError(f"reps and rounds must be at least 1, got reps={reps}, "
                         f"rounds={rounds}")
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    flex_fn = None
    if flex:
        try:
            flex_fn = peers.compiled_flex()
        except Exception as exc:  # pragma: no cover - depends on the torch build
            print(f"FlexAttention unavailable: {exc}", file=sys.stderr)
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    total = len(shapes) * len(cases)
    step = 0
    for shape in shapes:
        w = WORKLOADS[shape]
        h, d, L = (heads or w.heads), w.head_dim, w.seq_len
        qkv = tuple(torch.randn(batch, h, L, d, device="cuda", dtype=torch.bfloat16)
                    for _ in range(3))
        q, k, v = qkv
        dense_flops = 4 * d * L * L * batch * h
        dense_ms = {}
        for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"),
                               (SDPBackend.FLASH_ATTENTION, "flash")) if sdpa else ():
            try:
                with sdpa_kernel(backend):
                    dense_ms[label] = cuda_time_ms(
                        lambda: F.scaled_dot_product_attention(q, k, v), reps, burst=BURST)
            except Exception as exc:
                print(f"\nSDPA {label} failed: {exc}", file=sys.stderr)
        padded = {}  # q, k, v at a length padded to whole 64-token blocks
        for case in cases:
            _progress(step, total, f"{shape} {case}")
            step += 1
            q, k, v = qkv
            blocks, qb, kb = case_blocks(shape, case, h, rng)
            length = int(qb[-1])
            if length != L:
                if length not in padded:
                    padded[length] = tuple(torch.randn(batch, h, length, d, device="cuda",
                                                       dtype=torch.bfloat16) for _ in range(3))
                q, k, v = padded[length]

            if host_mask:
                blocks = blocks.cpu().numpy()

            def new_mask():
                return tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=kb)

            m = new_mask()
            flops = 4 * d * int(m.selected_pairs(batch, h).sum())
            arch = device_cc() if host_mask else None  # a host mask's plan for this GPU
            p = tessera.plan(m, num_q_heads=h, head_dim=d, batch=batch, regime=regime,
                             arch=arch)
            ours = p.run(q, k, v)
            row = dict(shape=shape, case=case, density=round(m.density, 4), host_mask=host_mask,
                       useful_tflop=flops / 1e12, regime=p.regime.name, stats=str(p.stats()))
            found = _peers(q, k, v, ours, m, new_mask, flex_fn, shape, case, row,
                           dense=case == "dense")
            # The kernels, Tessera's and each peer's, in the same interleaved rounds: timed one
            # after the other, each would read what ran before it (docs/benchmarking.md).
            kernels = {"tessera": lambda: p.run(q, k, v), **{x.name: x.run for x in found}}
            rounds_ms = interleaved_ms(kernels, rounds=rounds, reps=3, burst=BURST)
            kernel_ms = {name: statistics.median(t) for name, t in rounds_ms.items()}
            t_kernel = kernel_ms["tessera"]
            row.update(tessera_ms=t_kernel, tessera_tflops=flops / t_kernel / 1e9,
                       rounds_ms=rounds_ms)
            for x in found:
                t = kernel_ms[x.name]
                row.update({f"{x.name}_ms": t, f"{x.name}_tflops": flops / t / 1e9,
                            f"kernel_vs_{x.name}": t / t_kernel})
            # The host-inclusive figures: one call alone, planning, requests.
            t_call = cuda_time_ms(lambda: p.run(q, k, v), reps)
            t_plan = cuda_time_ms(lambda: tessera.plan(new_mask(), num_q_heads=h, head_dim=d,
                                                       batch=batch, regime=regime, arch=arch),
                                  reps)
            t_req = cuda_time_ms(lambda: tessera.attention(q, k, v, new_mask(), regime=regime),
                                 reps)
            # Back to back: BURST requests between synchronizations, as a model's layer loop
            # issues them (the host runs ahead unless something waits for the GPU).
            t_b2b = cuda_time_ms(lambda: tessera.attention(q, k, v, new_mask(), regime=regime),
                                 reps, burst=BURST)
            row.update(tessera_call_ms=t_call, tessera_plan_ms=t_plan,
                       tessera_request_ms=t_req, tessera_b2b_ms=t_b2b)
            for label, t in dense_ms.items():
                row[f"sdpa_{label}_ms"] = t
                row[f"sdpa_{label}_tflops"] = dense_flops / t / 1e9
            for x in found:
                if x.request is None:
                    continue
                t_x_req = cuda_time_ms(x.request, reps)
                row.update({f"{x.name}_request_ms": t_x_req,
                            f"request_vs_{x.name}": t_x_req / t_req})
                if x.name == "flex":
                    t_flex_call = cuda_time_ms(x.run, reps)
                    t_flex_b2b = cuda_time_ms(x.request, reps, burst=BURST)
                    row.update(flex_call_ms=t_flex_call, call_vs_flex=t_flex_call / t_call,
                               flex_build_ms=cuda_time_ms(x.build, reps),
                               flex_b2b_ms=t_flex_b2b, b2b_vs_flex=t_flex_b2b / t_b2b)
            rows.append(row)
    _progress(total, total, "done")
    return rows


@dataclass
class _Peer:
    """A peer's prepared kernel call on one mask (``run``), checked against Tessera's output,
    and where the peer has one its dynamic-mask request (``request``: its mask object built
    from the BlockMask, then run) and that build alone (``build``). ``name`` prefixes the
    peer's figures in a row (``flex_ms``, ``kernel_vs_flex``, ...)."""

    name: str
    run: Callable[[], Any]
    request: Callable[[], Any] | None = None
    build: Callable[[], Any] | None = None


def _peers(q, k, v, ours, m, new_mask, flex_fn, shape, case, row: dict,
           dense: bool) -> list[_Peer]:
    """Each installed peer at its best on mask ``m`` (:mod:`tessera.tools.peers`), its output
    compared with Tessera's ``ours`` first: a peer more than PEER_TOLERANCE away computes
    something else and is flagged in ``row`` (``<peer>_differs``), not returned (not timed).
    Every peer's difference goes into ``row`` (``<peer>_diff``), with its block size."""
    found: list[_Peer] = []

    def checked(name, out) -> bool:
        return peers.agrees(row, name, peers.relative_difference(out, ours),
                            f"on {shape}/{case}")

    if flex_fn is not None:
        try:
            fm = peers.flex_block_mask(m, q.device)
            opts = peers.flex_kernel_options(fm)

            def flex_run(bm):
                return flex_fn(q, k, v, block_mask=bm, kernel_options=opts)

            def build():
                return peers.flex_block_mask(new_mask(), q.device)

            if checked("flex", flex_run(fm)):
                found.append(_Peer("flex", lambda: flex_run(fm), lambda: flex_run(build()),
                                   build))
                row["flex_block"] = int(fm.BLOCK_SIZE[0])
        except Exception as exc:
            print(f"\nFlex failed on {shape}/{case}: {exc}", file=sys.stderr)
    if peers.cudnn_bsa_available():
        try:
            inputs = peers.cudnn_bsa_inputs(m, q.shape[0], q.shape[1], q.device, k.shape[1])
            if inputs is not None and checked("cudnn_bsa",
                                              peers.run_cudnn_bsa(q, k, v, inputs)):
                found.append(_Peer(
                    "cudnn_bsa", lambda: peers.run_cudnn_bsa(q, k, v, inputs),
                    lambda: peers.run_cudnn_bsa(q, k, v, peers.cudnn_bsa_inputs(
                        new_mask(), q.shape[0], q.shape[1], q.device, k.shape[1]))))
                row["cudnn_bsa_block"] = inputs.block
        except Exception as exc:
            print(f"\ncuDNN BSA failed on {shape}/{case}: {exc}", file=sys.stderr)
    if dense and flex_fn is not None and peers.fa4_available():
        try:  # FlashAttention-4 through FlexAttention's FLASH backend, no block mask: dense
            def fa4():
                return flex_fn(q, k, v, kernel_options={"BACKEND": "FLASH"})

            if checked("fa4", fa4()):
                found.append(_Peer("fa4", fa4))
        except Exception as exc:
            print(f"\nFlashAttention-4 failed on {shape}/{case}: {exc}", file=sys.stderr)
    return found


def table(rows: list[dict]) -> str:
    """The figures as a fixed-width table (ms, useful TFLOP/s, ratios to FlexAttention and to
    cuDNN BSA ("bsa"); peers not installed, not applicable or flagged show nan)."""
    nan = float("nan")
    out = [f"{'shape':15} {'case':17} {'dens':>5} {'kernel':>7} {'TF/s':>5} {'call':>6} "
           f"{'plan':>6} {'request':>7} {'b2b':>6} {'flex':>7} {'TF/s':>5} {'f.call':>6} "
           f"{'f.req':>7} {'f.b2b':>6} {'k x':>5} {'c x':>5} {'req x':>5} {'b2b x':>5} "
           f"{'cudnn':>6} {'fa2':>6} {'bsa':>6} {'k x':>5} {'fa4':>6}"]
    for r in rows:
        out.append(
            f"{r['shape']:15} {r['case']:17} {r['density']:5.2f} {r['tessera_ms']:7.2f} "
            f"{r['tessera_tflops']:5.0f} {r.get('tessera_call_ms', nan):6.2f} "
            f"{r['tessera_plan_ms']:6.2f} "
            f"{r['tessera_request_ms']:7.2f} {r.get('tessera_b2b_ms', nan):6.2f} "
            f"{r.get('flex_ms', nan):7.2f} {r.get('flex_tflops', nan):5.0f} "
            f"{r.get('flex_call_ms', nan):6.2f} "
            f"{r.get('flex_request_ms', nan):7.2f} {r.get('flex_b2b_ms', nan):6.2f} "
            f"{r.get('kernel_vs_flex', nan):5.2f} {r.get('call_vs_flex', nan):5.2f} "
            f"{r.get('request_vs_flex', nan):5.2f} {r.get('b2b_vs_flex', nan):5.2f} "
            f"{r.get('sdpa_cudnn_ms', nan):6.2f} {r.get('sdpa_flash_ms', nan):6.2f} "
            f"{r.get('cudnn_bsa_ms', nan):6.2f} {r.get('kernel_vs_cudnn_bsa', nan):5.2f} "
            f"{r.get('fa4_ms', nan):6.2f}")
    return "\n".join(out)


def chart(rows: list[dict], path: str) -> None:
    """Bar chart of useful TFLOP/s per (shape, case) for Tessera and FlexAttention."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    labels = [f"{r['shape']}\n{r['case']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    ax.bar(x - 0.2, [r["tessera_tflops"] for r in rows], 0.4, label="Tessera")
    ax.bar(x + 0.2, [r.get("flex_tflops", 0) for r in rows], 0.4, label="FlexAttention")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("useful TFLOP/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_json(path: str | None, rows: list[dict], **what: Any) -> None:
    """A run's rows to ``path`` (nothing without one), with the date, the GPU and ``what``
    kind of run it was."""
    if path:
        import torch  # noqa: PLC0415

        with open(path, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(),
                           **what, rows=rows), f, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera bench")
    ap.add_argument("--shape", default=None,
                    help=f"comma list of {', '.join(WORKLOADS)} (default: wan-1.3b-480p,"
                         "cogvideox-5b; with --distributed: hunyuan-720p)")
    ap.add_argument("--case", default=None,
                    help=f"comma list of {', '.join(CASES)} (default: all, unless --family)")
    ap.add_argument("--family", default=None,
                    help=f"comma list of mask families: {', '.join(FAMILIES)}, or 'all'")
    ap.add_argument("--heads", type=positive_int, default=None,
                    help="query heads (default: the model's; data-dependent families build "
                         "their masks on the host, which takes a while at full size)")
    ap.add_argument("--regime", default=None,
                    help="a regime name (as plan.regime.name prints it) to use for every case "
                         "instead of the table's or the heuristic's")
    ap.add_argument("--reps", type=positive_int, default=20,
                    help="timings of each host-inclusive figure (call, plan, request)")
    ap.add_argument("--rounds", type=positive_int, default=8,
                    help="interleaved rounds timing the kernels, Tessera's and the peers' "
                         "(default 8)")
    ap.add_argument("--host-mask", action="store_true",
                    help="plan host copies of the masks (as numpy-built masks are planned)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true",
                    help="leave out the dense SDPA baselines (slow at 100k+ tokens)")
    ap.add_argument("--json", help="write the figures as JSON here")
    ap.add_argument("--png", help="write a bar chart here (needs matplotlib)")
    ap.add_argument("--backward", action="store_true",
                    help="the backward pass against FlexAttention's, cuDNN BSA's and "
                         "FlashAttention-4's (see tessera.tools.bench_backward)")
    ap.add_argument("--kv-heads", type=positive_int, default=None,
                    help="(--backward) GQA: kv heads, dividing the query heads (default: MHA)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                    help="(--backward) the inputs' element type (default bfloat16)")
    ap.add_argument("--precision", default=None,
                    help=f"comma list of 8-bit forwards, {', '.join(PRECISION_SCHEMES)}: each "
                         "against the bf16 one and cuDNN's FP8 forward (see "
                         "tessera.tools.bench_int8)")
    ap.add_argument("--distributed", action="store_true",
                    help="sequence-parallel attention over the GPUs of a torchrun launch "
                         "(cases: random-10, mixed-heads; see tessera.tools.bench_distributed)")
    args = ap.parse_args(argv)
    shapes = (args.shape or ("hunyuan-720p" if args.distributed else
                             "wan-1.3b-480p,cogvideox-5b")).split(",")
    for s in shapes:
        if s not in WORKLOADS:
            ap.error(f"unknown shape {s!r}; choose from {', '.join(WORKLOADS)}")
    if args.backward and (args.regime or args.png or args.host_mask or args.distributed):
        ap.error("--backward takes --shape, --case, --family, --heads, --kv-heads, --dtype, "
                 "--reps, --rounds, --no-flex and --json")
    if args.precision and (args.backward or args.distributed or args.regime or args.png
                           or args.host_mask):
        ap.error("--precision takes --shape, --case, --family, --heads, --rounds and --json")
    precisions = tuple(args.precision.split(",")) if args.precision else ()
    for p in precisions:
        if p not in PRECISION_SCHEMES:
            ap.error(f"--precision: {p!r} is not one of {', '.join(PRECISION_SCHEMES)}")
    if not args.backward and (args.kv_heads or args.dtype != "bfloat16"):
        ap.error("--kv-heads and --dtype are options of --backward")
    if args.kv_heads:
        for s in shapes:
            h = args.heads or WORKLOADS[s].heads
            if h % args.kv_heads:
                ap.error(f"--kv-heads {args.kv_heads} does not divide {s}'s {h} query heads")
    if args.distributed:
        if args.family or args.regime or args.png or args.host_mask:
            ap.error("--distributed takes --shape, --case, --reps and --json only")
        cases = args.case.split(",") if args.case else list(bench_distributed.DIST_CASES)
        return bench_distributed.main(shapes, cases, args.reps, args.json)
    cases = args.case.split(",") if args.case else ([] if args.family else list(CASES))
    families = (list(FAMILIES) if args.family == "all" else args.family.split(",")) \
        if args.family else []
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")
    for f in families:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}; choose from {', '.join(FAMILIES)}")
    if args.png:
        require_matplotlib(ap, "--png")
    regime = None
    if args.regime is not None:
        regime = regime_from_name(args.regime)
        if regime is None:
            ap.error(f"--regime: not a regime name: {args.regime!r} (e.g. "
                     "'sm90_128x128_w12_s3[combine_threshold=0.0]')")
    try:
        import torch  # noqa: PLC0415

        has_gpu = torch.cuda.is_available()
    except ImportError:
        print("bench needs PyTorch (baselines and CUDA timers); it is not installed here.")
        return 1
    if not has_gpu:
        print("bench needs a CUDA GPU; none is visible. `python -m tessera demo` runs on the "
              "CPU emulator instead.")
        return 1
    if args.precision:
        rows = bench_int8.run(shapes, cases + families, case_blocks, heads=args.heads,
                              rounds=args.rounds, precisions=precisions)
        print(bench_int8.table(rows))
        _write_json(args.json, rows, precision=args.precision)
        return 0
    if args.backward:
        rows = bench_backward.run(shapes, cases + families, case_blocks, heads=args.heads,
                                  rounds=args.rounds, reps=args.reps, flex=not args.no_flex,
                                  kv_heads=args.kv_heads, dtype=args.dtype)
        print(bench_backward.table(rows))
        _write_json(args.json, rows, backward=True)
        return 0
    rows = run(shapes, cases + families, args.reps, flex=not args.no_flex, heads=args.heads,
               regime=regime, rounds=args.rounds, sdpa=not args.no_sdpa,
               host_mask=args.host_mask)
    print(table(rows))
    print("regimes: " + "; ".join(f"{r['shape']} {r['case']}: {r['regime']}" for r in rows))
    _write_json(args.json, rows)
    if args.png:
        chart(rows, args.png)
    return 0
