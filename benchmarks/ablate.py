"""Where an sm90 kernel's time goes: a ``bench`` case's plan timed in one process against plans of
the same regime whose kernel is built from a changed source (``--patch``): one part of the consumer
loop taken out (the softmax, its exponentials, the P·V products, the warpgroups' issue turns), the
order of its exponentials against the P·V wait flipped or held at another place, P's conversion
moved after O's rescale, or one of the TMA producer's choices taken
back (staged span fields, one producer warp, the chunk's fields read after the issue, the
whole-span walk) or the softmax's (the warp's vote ahead of the row maxima's shuffles), or a
shortcut measured and not kept (the thread index declared non-negative, no proxy fence after a
stage lands, part of the exponentials on the FMA pipe, O's rescale between two issues, the issue
turn passed before the chunk's word is read, that word read ahead of the issue, the whole-span walk
beyond the rings). An ablated kernel may compute something else
by design and is only timed; each plan's largest difference from the unchanged kernel's output is
printed (0 for the choices, which change no result). ``--against`` times plans of other regimes of
the same mask in the same rounds (e.g. a CTA of four rings against three CTAs an SM of the same
tiles).

    python3 benchmarks/ablate.py --shape wan-1.3b-480p --case dense --patch softmax,exp,pv,turns
    python3 benchmarks/ablate.py --shape cogvideox-5b --case topk64-10 \
        --against "sm90_64x64_w20_s3[combine_threshold=0.0]"

The configurations are timed in rounds, each its ``BURST``-call timings, the order rotated and
reversed every other round (no configuration always runs first, on a GPU that has just idled
through a compile), after two seconds of warm-up; the median of the rounds is reported, and the
ratio of the unchanged kernel's time to each. ``--peer cudnn-bsa`` times cuDNN's block-sparse
attention in the same rounds, once its output agrees with the kernel's. A patch that no longer
applies (its text not found exactly once in the current sources) stops the program before
anything runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from tessera.runtime.regime import regime_from_name

_ML = "sm90/mainloop.cuh"
_SOFTMAX_CALL = ("        softmax_chunk(s, m, l, al, walk.key0(), walk.key_end(), "
                 "t0 >= lo && t0 < hi,\n"
                 "                      t0 + 8 >= lo && t0 + 8 < hi, quad, a.scale_log2);")
_PV_ISSUE = ("        for (int kk = 0; kk < W / 16; ++kk) "
             "Wgmma<D>::rs(&o[0][0], pa[kk], vd.at(v_step(kk)), 1);\n"
             "        wgmma_commit();\n"
             "      }\n"
             "      if (!prepare_first) prepare();\n"
             "      pass_issue_turn(wg);")

_TID_READ = """  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;"""
_FULL_WAIT = """        mbar_wait(r.full_bar + 8 * (j % STAGES), (j / STAGES) & 1);
        fence_async_smem();"""
_MAX_VOTE = ("  if (__any_sync(0xffffffffu, mx0 * scale_log2 > lim0 || "
             "mx1 * scale_log2 > lim1)) {")
_FAST_EXP2 = """__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""
# 2^x = 2^floor(x) * p(frac): the floor rounded into the low bits of 1.5 * 2^23, p a least
# squares fit of 2^f on [0, 1) with p(0) = 1 (max relative error 8.6e-5), so -inf (clamped to
# -127) gives 0 exactly; max.NaN keeps a NaN score NaN.
_POLY_EXP2 = """__device__ __forceinline__ float poly_exp2(float x) {
  float c, r;
  asm("max.NaN.f32 %0, %1, 0fC2FE0000;" : "=f"(c) : "f"(x));
  asm("add.rm.f32 %0, %1, 0f4B400000;" : "=f"(r) : "f"(c));
  const float f = c - (r - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.0770652f, f, 0.227647f), f, 0.69511634f), f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(r) << 23));
}
__device__ __forceinline__ float mixed_exp2(int nt, float x) {
  return (0x88u >> nt) & 1u ? poly_exp2(x) : fast_exp2(x);
}
"""

# O's rescale by the two rows' factors, unconditional: a branch between two wgmma issues is a
# divergent path, on which ptxas serializes them.
_RESCALE = """      {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          o[i][0] *= al[0]; o[i][1] *= al[0];
          o[i][2] *= al[1]; o[i][3] *= al[1];
        }
      }
"""
_LAST_PV = ("    if (jt > 0) {  // the last chunk's P V (uniform: every thread walked the same "
            "spans)\n")

_WHOLE_SPANS = "constexpr bool WHOLE_SPANS = !WHOLE_TASKS && STAGED_SPANS && RINGS > 1 && D == 64;"

# name -> (what it shows, ((source file under tessera/cuda, text, replacement), ...))
PATCHES: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {
    "softmax": ("no softmax: P is the raw scores (the matrix work and its feed alone)",
                ((_ML, _SOFTMAX_CALL, "        al[0] = al[1] = 1.f;"),)),
    "exp": ("exponentials replaced by their arguments (the MUFU's work gone, the rest kept)",
            (("common/types.cuh", 'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));',
              "y = x;"),)),
    "pv": ("no P V products (S and the softmax: half the matrix work)",
           ((_ML, _PV_ISSUE, _PV_ISSUE.replace("Wgmma<D>::rs", "if (0) Wgmma<D>::rs")),)),
    "turns": ("consumer warpgroups issue their wgmma without taking turns",
              (("sm90/sync.cuh", "    if (WS) named_bar_sync(1 + wg, 256);\n"
                "    else if (wg == 1) named_bar_sync(1, 256);",
                "    if (!WS && wg == 1) named_bar_sync(1, 256);"),
               ("sm90/sync.cuh", "    if (WS) named_bar_arrive(1 + (wg + 1) % WGS, 256);\n"
                "    else if (wg == 0) named_bar_arrive(1, 256);",
                "    if (!WS && wg == 0) named_bar_arrive(1, 256);"))),
    # The variants set it where it pays (variants.pv_wait_anchored); this flips it everywhere.
    "anchor": ("the exponentials' order against the P V wait flipped (order_wait_after on "
               "where the variant has it off, off where on)",
               (("sm90/traits.cuh", "constexpr bool PV_WAIT_ANCHOR = Config::PV_WAIT_ANCHOR != 0;",
                 "constexpr bool PV_WAIT_ANCHOR = Config::PV_WAIT_ANCHOR == 0;"),)),
    "unstaged": ("TMA consumers read each chunk's span fields from global memory instead of "
                 "the producer's word beside the stage (STAGED_SPANS off)",
                 (("sm90/traits.cuh", "constexpr bool STAGED_SPANS = TMA;",
                   "constexpr bool STAGED_SPANS = false;"),)),
    "prepare-first": ("each chunk's word read and V tail zeroed before its products are "
                      "issued where the variant does it after, and after where before "
                      "(PREPARE_FIRST flipped)",
                      (("sm90/traits.cuh", "constexpr bool PREPARE_FIRST = PV_WAIT_ANCHOR;",
                        "constexpr bool PREPARE_FIRST = !PV_WAIT_ANCHOR;"),)),
    "producer-warps": ("all four producer warps run the TMA producer's loop, not one",
                       (("sm90/traits.cuh",
                         "constexpr int PRODUCER_THREADS = Config::TMA ? 32 : LOADERS;",
                         "constexpr int PRODUCER_THREADS = LOADERS;"),)),
    # Shortcuts that were measured and not kept (docs/decisions.md, "Tried and not kept").
    "assume-tid": ("the thread index declared non-negative and below 1024 (__builtin_assume): "
                   "its modulos and quotients as masks and shifts",
                   (("sm90/sync.cuh", _TID_READ, _TID_READ.replace(
                       "  return t;", "  __builtin_assume(t >= 0 && t < 1024);\n  return t;")),)),
    "no-fence": ("the TMA consumers skip the proxy fence after a stage's full barrier",
                 ((_ML, _FULL_WAIT, _FULL_WAIT.replace(
                     "        fence_async_smem();",
                     "        if constexpr (!TMA) fence_async_smem();")),)),
    "early-rescale": ("O takes the previous chunk's rescale between the issues of S_j and "
                      "P_{j-1} V_{j-1} (FlashAttention-4's sm90 order above head dim 128), "
                      "instead of after the wait for that product",
                      ((_ML, "    GuardedRows<D / 8> kept;\n",
                        "    GuardedRows<D / 8> kept;\n    float al[2] = {1.f, 1.f};\n"),
                       (_ML, "      float al[2], f[2];\n", "      float f[2];\n"),
                       (_ML, "      if (guard_prev) kept.keep(o);\n\n"
                        "      wait_issue_turn(wg);", "      wait_issue_turn(wg);"),
                       (_ML, "#pragma unroll\n" + _PV_ISSUE,
                        _RESCALE + "        if (guard_prev) kept.keep(o);\n"
                        "        wgmma_hold<D / 2>(&o[0][0]);\n        wgmma_fence();\n"
                        "#pragma unroll\n" + _PV_ISSUE),
                       (_ML, "      guard_prev = guard;\n      rescale_o(o, al);\n",
                        "      guard_prev = guard;\n"),
                       (_ML, _LAST_PV, _LAST_PV + _RESCALE))),
    "rows-per-chunk": ("the thread's rows and quad read from its index every chunk, not once a "
                       "task",
                       ((_ML, "      } else {\n        softmax_chunk(s, m, l, al, walk.key0(), "
                         "walk.key_end(), t0 >= lo && t0 < hi,\n",
                         "      } else {\n        const int lane_now = thread_index() % 32;\n"
                         "        const int tr = tok_base + lane_now / 4;\n"
                         "        softmax_chunk(s, m, l, al, walk.key0(), walk.key_end(), "
                         "tr >= lo && tr < hi,\n"),
                        (_ML, "                    t0 + 8 >= lo && t0 + 8 < hi, "
                         "quad, a.scale_log2);",
                         "                    tr + 8 >= lo && tr + 8 < hi, lane_now % 4, "
                         "a.scale_log2);"))),
    "read-first": ("the chunk's word read before the products are issued and used after, not "
                   "read after them (the V tail still zeroed after the issue)",
                   ((_ML, "      const auto prepare = [&] {\n"
                     "        if constexpr (STAGED_SPANS) walk.read(r.chunk_info + 16 * "
                     "(j % STAGES));\n",
                     "      if constexpr (STAGED_SPANS) walk.read(r.chunk_info + 16 * "
                     "(j % STAGES));\n      const auto prepare = [&] {\n"),)),
    "turn-first": ("the issue turn passed right after the products' commit, before the chunk's "
                   "word is read and its V tail zeroed (FlashAttention-4's place for it)",
                   ((_ML, "      if (!prepare_first) prepare();\n"
                     "      pass_issue_turn(wg);",
                     "      pass_issue_turn(wg);\n      if (!prepare_first) prepare();"),)),
    "whole-span-all": ("whole-span tasks walked by arithmetic in every TMA variant, not the "
                       "rings' at head dim 64 only (a second loop in each)",
                       (("sm90/traits.cuh", _WHOLE_SPANS,
                         "constexpr bool WHOLE_SPANS = !WHOLE_TASKS && STAGED_SPANS;"),)),
    "no-whole-span": ("whole-span tasks read each chunk's word and clip its rows like every "
                      "other task (no WholeSpanWalk)",
                      (("sm90/traits.cuh", _WHOLE_SPANS, "constexpr bool WHOLE_SPANS = false;"),)),
    "p-late": ("P converted after O's rescale, not right after the wait for the previous "
               "P V (ptxas then converts it after every exponential, not between them)",
               ((_ML, "#pragma unroll\n        for (int kk = 0; kk < W / PK; ++kk) "
                 "p_fragment(pa[kk], s, kk);\n", ""),
                (_ML, "      vs_prev = ks + K_BYTES;",
                 "      if constexpr (!INT8_PV) {\n#pragma unroll\n"
                 "        for (int kk = 0; kk < W / PK; ++kk) p_fragment(pa[kk], s, kk);\n"
                 "      }\n      vs_prev = ks + K_BYTES;"))),
    "pv-wait-sums": ("the P V wait held after the row sums (every exponential ahead of it), "
                     "not after the first exponentials, where the variant holds it",
                     ((_ML, "order_wait_after(r.q_base, (s[0][0] + s[0][2]) * "
                       "a.scale_log2);", "order_wait_after(r.q_base, l[0] + l[1]);"),)),
    # The softmax's choices (common/softmax.cuh), taken back.
    "shuffle-max": ("every chunk's row maxima through the quad shuffles, without the warp's "
                    "vote on its threads' own maxima first",
                    (("common/softmax.cuh", _MAX_VOTE, "  {"),)),
    "exp-poly": ("a quarter of the exponentials (score octets 3 and 7 of each thread's 8 at "
                 "64-key steps) as a degree-3 polynomial on the FMA pipe instead of the MUFU",
                 (("common/types.cuh", _FAST_EXP2, _FAST_EXP2 + _POLY_EXP2),
                  *(("common/softmax.cuh", f"s[nt][{e}] = fast_exp2(",
                     f"s[nt][{e}] = mixed_exp2(nt, ") for e in range(4)))),
}


def patched_sources(names: list[str]) -> dict[str, str]:
    """The kernel sources with the patches ``names`` applied: {file: text} of the files they
    change. Raises ValueError naming a patch whose text is not found exactly once."""
    from tessera.cuda import loader

    out: dict[str, str] = {}
    for name in names:
        if name not in PATCHES:
            raise ValueError(f"--patch: unknown patch {name!r} (known: {', '.join(PATCHES)})")
        for path, old, new in PATCHES[name][1]:
            text = out.get(path) or loader._read_source(path)
            if text.count(old) != 1:
                raise ValueError(f"patch {name!r} no longer applies: its text occurs "
                                 f"{text.count(old)} times in {path}, not once")
            out[path] = text.replace(old, new)
    return out


class _SourceOverride:
    """While active, the kernel loader reads the given sources instead of the files, and
    forgets the block-sparse kernels it has built (the planner's stay)."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources

    def __enter__(self) -> "_SourceOverride":
        from tessera.cuda import loader

        self._read = loader._read_source
        loader._read_source = lambda name: self.sources.get(name) or self._read(name)
        self._forget()
        return self

    def __exit__(self, *exc) -> None:
        from tessera.cuda import loader

        loader._read_source = self._read
        self._forget()

    @staticmethod
    def _forget() -> None:
        from tessera.cuda import loader

        for key in [k for k in loader._loaded if k[0].source.endswith("bsa.cu")]:
            del loader._loaded[key]
        for key in [k for k in loader._modules if k[0].endswith("bsa.cu")]:
            del loader._modules[key]


def _regime_names(text: str) -> list[str]:
    """Comma-separated regime names, commas inside a name's brackets kept."""
    names, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            names.append(cur)
            cur = ""
        else:
            cur += ch
    return [n for n in names + [cur] if n]


def main(argv: list[str] | None = None) -> int:
    import torch

    import tessera
    from tessera.cuda.device import device_cc
    from tessera.tools import peers
    from tessera.tools.bench import BURST, CASES
    from tessera.tools.timing import interleaved_ms
    from tessera.tools.workloads import WORKLOADS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--case", required=True,
                    help=f"bench cases on uniform blocks, comma-separated ({', '.join(CASES)})")
    ap.add_argument("--patch", default="",
                    help=f"patches, comma-separated ({', '.join(PATCHES)}); 'a+b' applies "
                         "two together")
    ap.add_argument("--regime", help="a Regime name (default: the plan's own selection)")
    ap.add_argument("--against", default="",
                    help="Regime names, comma-separated outside brackets: their plans of the "
                         "same mask, timed in the same rounds")
    ap.add_argument("--host-mask", action="store_true",
                    help="plan a host copy of the mask (the general planner) instead of the "
                         "device mask (the planner kernels); either plan counts the mask's "
                         "blocks, so a dense layer takes whole spans and a filled last wave")
    ap.add_argument("--heads", type=int,
                    help="query heads (default: the model's; fewer give each SM fewer tasks)")
    ap.add_argument("--rounds", type=int, default=8, help="timing rounds (default 8)")
    ap.add_argument("--peer", choices=("cudnn-bsa",),
                    help="time cuDNN's block-sparse attention in the same rounds (as bench "
                         "configures it; it must be installed), its output checked first")
    args = ap.parse_args(argv)
    cases = args.case.split(",")
    for c in cases:
        if c not in CASES or CASES[c].sizes is not None:
            ap.error(f"--case: {c!r} is not a bench case on uniform blocks")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.heads is not None and args.heads < 1:
        ap.error(f"--heads must be at least 1, got {args.heads}")
    patches = [p for p in args.patch.split(",") if p]
    against = {}
    for name in _regime_names(args.against):
        r = regime_from_name(name)
        if r is None:
            ap.error(f"--against: {name!r} is not a regime name")
        against[name] = r
    if not patches and not against:
        ap.error("nothing to compare: give --patch or --against")
    try:
        sources = {p: patched_sources(p.split("+")) for p in patches}
    except ValueError as exc:
        ap.error(str(exc))
    if args.peer and not peers.cudnn_bsa_available():
        ap.error("--peer cudnn-bsa: nvidia-cudnn-frontend is not installed")
    regime = None
    if args.regime:
        regime = regime_from_name(args.regime)
        if regime is None:
            ap.error(f"--regime: {args.regime!r} is not a regime name")
    for p in patches:
        for name in p.split("+"):
            print(f"{name}: {PATCHES[name][0]}")

    w = WORKLOADS[args.shape]
    heads = args.heads or w.heads
    rng = np.random.default_rng(0)
    for case in cases:
        c = CASES[case]
        qb = c.bounds(w.seq_len)  # as bench pads 64-token cases
        length = int(qb[-1])
        blocks = torch.from_numpy(c.make(rng, heads, qb.size - 1)).cuda()
        mask = tessera.BlockMask.from_dense(blocks.cpu().numpy() if args.host_mask else blocks,
                                            q_bounds=qb, kv_bounds=qb)
        q, k, v = (torch.randn(1, heads, length, w.head_dim, device="cuda",
                               dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * w.head_dim * int(mask.selected_pairs(1, heads).sum())
        calls, outs = {}, {}
        for name in ["kernel", *patches, *against]:
            with _SourceOverride(sources.get(name, {})):
                plan = tessera.plan(mask, num_q_heads=heads, head_dim=w.head_dim,
                                    dtype="bfloat16", regime=against.get(name, regime),
                                    arch=device_cc() if args.host_mask else None)
                calls[name] = (lambda p=plan: p.run(q, k, v))
                outs[name] = calls[name]().float()
                torch.cuda.synchronize()
                if name == "kernel":
                    regime_name = plan.regime.name
        if args.peer:
            inputs = peers.cudnn_bsa_inputs(mask, 1, heads, q.device)
            if inputs is None:
                print(f"{case}: not a mask cuDNN BSA runs exactly; not timed")
            else:
                out = peers.run_cudnn_bsa(q, k, v, inputs)
                diff = peers.relative_difference(out, outs["kernel"])
                if diff > peers.PEER_TOLERANCE:
                    print(f"{case}: cuDNN BSA differs by {diff:.2e}; not timed")
                else:
                    calls[args.peer] = (lambda: peers.run_cudnn_bsa(q, k, v, inputs))
                    outs[args.peer] = out.float()
        times = interleaved_ms(calls, rounds=args.rounds, reps=3, burst=BURST)
        base = statistics.median(times["kernel"])
        where = "host" if args.host_mask else "device"
        print(f"\n{args.shape} ({heads} heads) {case}, {where} mask: {regime_name}, "
              f"median of {args.rounds} rounds")
        print(f"{'kernel':24s} {'ms':>8s} {'TF/s':>6s} {'speed':>6s} {'max diff':>9s}  rounds")
        for name in calls:
            t = statistics.median(times[name])
            diff = (outs[name] - outs["kernel"]).abs().max().item()
            print(f"{name:24s} {t:8.3f} {flops / t / 1e9:6.0f} {base / t:6.3f} {diff:9.1e}  "
                  + " ".join(f"{x:.3f}" for x in times[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
