"""Host microseconds of a request's pieces, without cProfile's per-call overhead (which inflates
Python-heavy steps 2x and more): the library's own functions on the request path are wrapped in
timers, each keeping its inclusive and exclusive (own) time, and ``tessera.attention`` is called
with a new mask object each time, the GPU idle at the start of every call.

    python3 benchmarks/request_breakdown.py [--shape wan-1.3b-480p] [--density 0.1] [--n 300]

A request after the first of a geometry replans tessera.attention's kept plan (Plan.replan);
``--new-plans`` keeps none (api.request_plans_kept = 0), every request then plans anew.
"""

import argparse
import statistics
import sys
import time
from collections import defaultdict

import tessera
from tessera import api, interop, mask as mask_mod
from tessera.cuda import loader
from tessera.runtime import device_planner, mapping, plan as plan_mod, regime as regime_mod

from request_hotspots import random_request  # this folder's: run as a script

# (module, attribute): the request path's steps, as its callers look them up.
WRAPPED = [
    (api, "_describe"), (api, "_check_mask"), (api, "_caller_stream"), (api, "plan"),
    (api, "stream_capturing"), (api, "_launch"), (api, "_launch_here"),
    (api, "_tma_maps"), (api, "_device_queue"), (api, "_task_counter"),
    (api, "_wait_until_planned"), (api, "empty_like_caller"), (api, "from_any"),
    (api, "current_stream_ptr"),
    (plan_mod, "selected_regime"), (plan_mod, "plan_tasks_in_flight"),
    (plan_mod, "plan_may_split"), (plan_mod, "plan_on_device"), (plan_mod, "heads_per_task"),
    (plan_mod.Plan, "replan"), (plan_mod.Plan, "_planned"),
    (device_planner, "_assignments"),
    (device_planner, "_device_dense_rows"), (device_planner, "device_bounds"),
    (device_planner, "aligned_geometry"), (device_planner, "Workspace"),
    (device_planner._Launch, "__call__"),
    (loader, "load_kernel"), (loader, "blocks_per_sm"), (loader, "smem_bytes"),
    (regime_mod, "device_sm_count"), (regime_mod, "smem_limit_bytes"),
    (mapping, "device_bounds"), (interop, "from_any"),
]

# Per step: its inclusive and own seconds summed over the current request, and over the done
# requests a list of those sums.
_now_incl: dict = defaultdict(float)
_now_own: dict = defaultdict(float)
_now_calls: dict = defaultdict(int)
inclusive: dict = defaultdict(list)
own: dict = defaultdict(list)
calls: dict = defaultdict(list)
_stack: list = []


def close_request(names) -> None:
    """Move the current request's sums into the per-request lists (0 for steps not called)."""
    for name in names:
        inclusive[name].append(_now_incl.pop(name, 0.0))
        own[name].append(_now_own.pop(name, 0.0))
        calls[name].append(_now_calls.pop(name, 0))


def timed(name, fn):
    def wrapper(*a, **kw):
        _stack.append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            dt = time.perf_counter() - t0
            children = _stack.pop()
            _now_incl[name] += dt
            _now_own[name] += dt - children
            _now_calls[name] += 1
            if _stack:
                _stack[-1] += dt
    return wrapper


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--new-plans", action="store_true", help="keep no plans between requests")
    args = ap.parse_args(argv)
    if args.new_plans:
        api.request_plans_kept = 0
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)
    for _ in range(5):
        tessera.attention(q, k, v, new_mask())
    torch.cuda.synchronize()
    seen = {}
    for mod, attr in WRAPPED:
        fn = getattr(mod, attr)
        where = mod.__name__ if isinstance(mod, type) else getattr(fn, "__module__", mod.__name__)
        name = f"{where.split('.')[-1]}.{attr}"
        if id(fn) not in seen:
            seen[id(fn)] = timed(name, fn)
        setattr(mod, attr, seen[id(fn)])
    mask_mod.BlockMask.from_dense = classmethod(timed("mask.from_dense",
                                                      mask_mod.BlockMask.from_dense.__func__))
    whole = timed("attention (whole call)", tessera.attention)
    request = timed("request (mask + call)", lambda: whole(q, k, v, new_mask()))
    names = set()
    for _ in range(args.n):
        torch.cuda.synchronize()
        request()
        names |= set(_now_incl)
        close_request(names)
    torch.cuda.synchronize()
    print(f"{'step':36} {'calls':>5} {'incl us':>8} {'own us':>8}   (medians over requests)")
    for name in sorted(inclusive, key=lambda n: -statistics.median(inclusive[n])):
        print(f"{name:36} {statistics.median(calls[name]):5.0f} "
              f"{statistics.median(inclusive[name]) * 1e6:8.1f} "
              f"{statistics.median(own[name]) * 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
