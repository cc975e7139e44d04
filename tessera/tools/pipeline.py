"""``python -m tessera pipeline``: a diffusers video transformer at its published size, its
denoising steps' forwards run with the model's own dense attention, with Tessera and with
FlexAttention on the same method's masks; per-step time, attention share, the integration's
overhead (the attention time outside the attention kernels' calls, and the reorders of
``--keep-order``), speed-ups and how far the outputs are from each other.

Random weights unless ``--weights`` names a local checkpoint folder (nothing is downloaded).
Times are CUDA-event medians over ``--steps`` forwards after one warm-up forward per backend
(which also compiles FlexAttention); every backend's time includes its mask making.
``--compile``: every backend with the transformer's blocks compiled (``torch.compile``,
``fullgraph=True``, as diffusers' regional compilation does) -- dense as the model's own
compiled forward, with no Tessera in its path, so its attention time is not split out.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from typing import Any

import numpy as np

from ..distribution import install_hint
from ..cuda.device import current_gpu_name
from ..integrations import diffusers as td
from ..integrations import methods as M
from ..integrations.presets import PRESETS
from .args import (fraction, nonnegative_int, positive_int, preset_config, require_matplotlib,
                   saved_config)
from .bench import _progress
from .models import MODELS, build, inputs
from .peers import compiled_flex, flex_block_mask, flex_kernel_options

__all__ = ["main", "flex_attention_runner", "run"]


def flex_attention_runner(compiled: bool = True) -> Any:
    """A ``Session.attention`` that runs each call's Tessera mask with FlexAttention
    (:func:`tessera.tools.peers.flex_block_mask`: token-exact, full tiles where it can). Its
    BlockMask is built once per mask object, as a Flex user keeps one for a fixed mask, and
    so on the GPU every call for masks made every call. ``compiled=False``: eager Flex (its
    reference implementation; CPU tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    flex = compiled_flex() if compiled else flex_attention
    built: dict = {}  # id(Tessera mask) -> (mask, device, Flex BlockMask)

    def run(q, k, v, mask, layout, scale):
        if layout == "blhd":
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        got = built.get(id(mask))
        if got is None or got[0] is not mask or got[1] != q.device:
            if len(built) > 64:
                built.clear()
            got = built[id(mask)] = (mask, q.device, flex_block_mask(mask, q.device))
        fm = got[2]
        options = flex_kernel_options(fm) if compiled else None
        out = flex(q, k, v, block_mask=fm, scale=scale, kernel_options=options)
        return out.transpose(1, 2) if layout == "blhd" else out

    return run


def add_method_arguments(ap: argparse.ArgumentParser) -> None:
    """The options that choose a method and schedule (``pipeline``, ``quality``)."""
    ap.add_argument("--method", choices=list(M.METHODS), default="topk_cubes")
    ap.add_argument("--density", type=fraction, default=0.1,
                    help="topk_cubes: key cubes kept, in (0, 1]")
    ap.add_argument("--tile", type=positive_int, nargs=3, default=(6, 8, 8), help="sliding_tile")
    ap.add_argument("--window", type=positive_int, nargs=3, default=(3, 3, 3),
                    help="sliding_tile")
    ap.add_argument("--heads", default="spatial", choices=["spatial", "temporal"],
                    help="spatial_temporal")
    ap.add_argument("--dense-steps", type=nonnegative_int, default=0)
    ap.add_argument("--dense-layers", type=nonnegative_int, default=0)
    given = ap.add_mutually_exclusive_group()
    given.add_argument("--config", type=saved_config,
                       help="a saved configuration (JSON, tessera.integrations.methods."
                            "SparseConfig): its method and schedule in place of --method, the "
                            "method's options, --dense-steps and --dense-layers")
    given.add_argument("--preset", type=preset_config, metavar="NAME",
                       help="a published setting, as --config (tessera.integrations.presets: "
                            + ", ".join(p.name for p in PRESETS) + ")")
    ap.add_argument("--save-config", metavar="PATH",
                    help="write the method and schedule this run uses to PATH (JSON)")


def config_from(args: argparse.Namespace) -> M.SparseConfig:
    """The method and schedule the options of :func:`add_method_arguments` name (written to
    ``--save-config`` when given)."""
    config = args.config or args.preset or M.SparseConfig(
        _method(args), M.Schedule(args.dense_steps, args.dense_layers))
    if args.save_config:
        config.save(args.save_config)
    return config


def parse_run(ap: argparse.ArgumentParser, argv: list[str] | None
              ) -> tuple[argparse.Namespace, M.SparseConfig, list[str]]:
    """A model command's arguments parsed and checked (``--png`` needs matplotlib), its method
    and schedule (:func:`config_from`), and which of torch and diffusers are missing."""
    args = ap.parse_args(argv)
    if args.png:
        require_matplotlib(ap, "--png")
    return args, config_from(args), [m for m in ("torch", "diffusers") if not _importable(m)]


def _method(args: argparse.Namespace) -> M.Method:
    if args.method == "sliding_tile":
        return M.SlidingTile(tile=tuple(args.tile), window=tuple(args.window))
    if args.method == "topk_cubes":
        return M.TopKCubes(density=args.density)
    if args.method == "spatial_temporal":
        return M.SpatialTemporal(heads=args.heads)
    if args.method == "radial":
        return M.Radial()
    return M.SemanticClusters()


def run(model_name: str, method: M.Method, steps: int = 3, schedule: M.Schedule | None = None,
        weights: str | None = None, tiny: bool = False, flex: bool = True,
        forwards_per_step: int = 1, keep_order: bool = False, compiled: bool = False,
        device: str = "cuda") -> dict:
    """Time one transformer's forwards per backend; returns the figures (see :func:`main`).
    ``compiled``: the transformer's blocks torch.compile'd for every backend (``--compile``).
    ``device="cpu"`` (the tiny check without a GPU): float32, Tessera's calls on the CPU
    emulator, eager Flex, host clocks -- a check that every backend runs and agrees, not a
    timing."""
    import torch

    cpu = device == "cpu"
    model = build(model_name, tiny=tiny, weights=weights, device=device,
                  dtype=torch.float32 if cpu else None)
    x = inputs(model_name, model, tiny=tiny)
    backends = ["dense", "tessera"] + (["flex"] if flex else [])
    result: dict = dict(model=model_name, method=method.name, steps=steps,
                        gpu="the CPU" if cpu else current_gpu_name(),
                        layers=len(td.self_attention_layers(model)),
                        compiled=compiled)
    if compiled:
        td.compile_blocks(model, fullgraph=True)
    outputs = {}
    total = len(backends) * (steps + 1)
    done = 0
    for backend in backends:
        if compiled:
            torch._dynamo.reset()  # each backend compiles afresh (no recompile limit shared)
        per_layer: list[list] = []  # per forward: (start, end) events of each attention call
        runs: list[list] = []  # per forward: the same around the attention kernels' call
        # per forward: the same around the token reorders of keep_order (block hooks, outside
        # the attention calls)
        reorders: list[list] = []
        session = None
        if not (compiled and backend == "dense"):
            sched = M.Schedule(dense_steps=10 ** 9) if backend == "dense" else schedule
            session = td.enable(model, method, schedule=sched,
                                forwards_per_step=forwards_per_step,
                                keep_order=keep_order and backend != "dense")
            if backend == "flex":
                session.attention = flex_attention_runner(compiled=not cpu)
            # (the calls run inside the routed op, eagerly even in a compiled block; the
            # reorders are traced into the blocks there: not timed alone)
            session._attend = _timed(session._attend, per_layer, cpu)
            if not compiled:
                session._reorder = _timed(session._reorder, reorders, cpu)
            if backend == "flex":
                session.attention = _timed(session.attention, runs, cpu)
            elif backend == "tessera":
                session._run = _timed(session._run, runs, cpu)
        step_ms = []
        with torch.no_grad():
            for i in range(steps + 1):  # the first: warm-up (compiles, loads kernels)
                per_layer.append([])
                runs.append([])
                reorders.append([])
                a, b = (_event(cpu) for _ in range(2))
                a.record()
                out = model(**x)[0]
                b.record()
                b.synchronize()
                if i:
                    step_ms.append(a.elapsed_time(b))
                done += 1
                _progress(done, total, f"{model_name} {backend} forward {i}")
        td.disable(model)
        outputs[backend] = out.float()
        result[backend] = dict(step_ms=statistics.median(step_ms))
        if session is None:  # (dense compiled: the model's own attention, not split out)
            result[backend].update(attention_ms=float("nan"), per_layer_ms=[])
            continue
        layers_ms = np.array([[s.elapsed_time(e) for s, e in calls] for calls in per_layer[1:]])
        run_ms = [sum(s.elapsed_time(e) for s, e in calls) for calls in runs[1:]]
        reorder_ms = [sum(s.elapsed_time(e) for s, e in calls) for calls in reorders[1:]]
        result[backend].update(attention_ms=float(np.median(layers_ms.sum(1))),
                               per_layer_ms=np.median(layers_ms, axis=0).tolist())
        if backend != "dense":
            # What the integration adds around the attention's own call (mask making,
            # reordering, bookkeeping): the attention time less the kernels' call, plus the
            # once-a-forward reorders of keep_order outside the attention calls.
            r = result[backend]
            r["run_ms"], r["reorder_ms"] = float(np.median(run_ms)), float(np.median(reorder_ms))
            r["overhead_ms"] = r["attention_ms"] - r["run_ms"] + r["reorder_ms"]
    ref = outputs["dense"]
    for backend in backends:
        r = result[backend]
        r["share"] = r["attention_ms"] / r["step_ms"]
        if "overhead_ms" in r:
            r["overhead_share"] = r["overhead_ms"] / r["step_ms"]
        r["vs_dense"] = result["dense"]["step_ms"] / r["step_ms"]
        r["diff_vs_dense"] = float((outputs[backend] - ref).norm() / ref.norm())
        if flex:
            r["diff_vs_flex"] = float((outputs[backend] - outputs["flex"]).norm()
                                      / outputs["flex"].norm())
            r["vs_flex"] = result["flex"]["step_ms"] / r["step_ms"]
    return result


class _HostEvent:
    """A CUDA event's interface on the host clock, for runs on the CPU."""

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1e3


def _event(cpu: bool) -> Any:
    """A timing event: CUDA's (GPU time) or the host clock's (a run on the CPU)."""
    import torch

    return _HostEvent() if cpu else torch.cuda.Event(enable_timing=True)


def _timed(fn: Any, calls: list[list], cpu: bool = False) -> Any:
    """``fn`` with timing events recorded around each call, appended to ``calls[-1]``."""

    def timed(*a, **kw):
        start, end = (_event(cpu) for _ in range(2))
        start.record()
        out = fn(*a, **kw)
        end.record()
        calls[-1].append((start, end))
        return out

    return timed


def table(result: dict) -> str:
    """The figures of :func:`run` as a text table: per backend the step, its attention (and of
    that the attention kernels' calls, "run", and the rest, the integration's "overhead", with
    its share of the step), the speed-ups and the differences."""
    nan = float("nan")
    head = (f"{result['model']} ({result['layers']} self-attention layers), method "
            f"{result['method']}, {result['steps']} forwards per backend, {result['gpu']}"
            + (", blocks compiled" if result.get("compiled") else ""))
    lines = [head, f"{'backend':8} {'step ms':>8} {'attn ms':>8} {'share':>6} {'run ms':>7} "
                   f"{'overhead':>8} {'x dense':>8} {'x flex':>7} {'diff/dense':>10} "
                   f"{'diff/flex':>9}"]
    for backend in ("dense", "tessera", "flex"):
        r = result.get(backend)
        if r is None:
            continue
        over = f"{r['overhead_share']:8.1%}" if "overhead_share" in r else f"{'':8}"
        lines.append(f"{backend:8} {r['step_ms']:8.1f} {r['attention_ms']:8.1f} "
                     f"{r['share']:6.0%} {r.get('run_ms', nan):7.1f} {over} "
                     f"{r['vs_dense']:8.2f} {r.get('vs_flex', nan):7.2f}"
                     f" {r['diff_vs_dense']:10.2e} {r.get('diff_vs_flex', nan):9.2e}")
    return "\n".join(lines)


def chart(result: dict, path: str) -> None:
    """Per-layer attention time, dense against the sparse backends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for backend in ("dense", "tessera", "flex"):
        if backend in result:
            ax.plot(result[backend]["per_layer_ms"], label=backend)
    ax.set_xlabel("self-attention layer")
    ax.set_ylabel("ms per call")
    ax.set_title(f"{result['model']}, {result['method']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera pipeline", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="wan-1.3b")
    add_method_arguments(ap)
    ap.add_argument("--steps", type=positive_int, default=3, help="timed forwards per backend")
    ap.add_argument("--weights", help="a local checkpoint folder (from_pretrained)")
    ap.add_argument("--tiny", action="store_true", help="the tiny configuration (a check)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--keep-order", action="store_true",
                    help="reorder tokens once per forward, not around every attention call")
    ap.add_argument("--compile", action="store_true",
                    help="every backend with the transformer's blocks torch.compile'd")
    ap.add_argument("--png", help="per-layer attention time, dense vs sparse (matplotlib)")
    args, config, missing = parse_run(ap, argv)
    if missing:
        print(f"pipeline needs {' and '.join(missing)} ({install_hint('diffusers')}) and a "
              f"CUDA GPU; {args.model} is {MODELS[args.model].notes}.")
        return 1
    import torch

    device = "cuda"
    if not torch.cuda.is_available():
        if not args.tiny or args.compile:
            print(f"pipeline needs a CUDA GPU (none found) but for --tiny without --compile, "
                  f"a check on the CPU; {args.model} is {MODELS[args.model].notes}.")
            return 1
        device = "cpu"
        print("no CUDA GPU: the tiny check runs on the CPU (Tessera on the CPU emulator, "
              "float32): it checks that the backends run and agree; its times are not the GPU's")
    result = run(args.model, config.method, args.steps, config.schedule, args.weights, args.tiny,
                 not args.no_flex, keep_order=args.keep_order, compiled=args.compile,
                 device=device)
    print(table(result))
    if args.png:
        chart(result, args.png)
    return 0


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
