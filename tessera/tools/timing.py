"""GPU timing for the offline tools (the bench driver, the profiler, the ablations): CUDA events
around calls, after a warm-up, the median of repeats; and calls timed in interleaved rounds, for
figures that are compared with each other."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterator

__all__ = ["cuda_time_ms", "interleaved_ms", "round_orders"]


def cuda_time_ms(fn: Callable[[], Any], reps: int = 20, warmup: int = 3,
                 stat: Callable[[list[float]], float] = statistics.median,
                 burst: int = 1) -> float:
    """``stat`` (the median unless told) of ``reps`` CUDA-event timings of ``fn`` after
    ``warmup`` calls, per call. ``burst`` > 1 times that many calls between the two events
    (the host queues them ahead while the GPU works), which leaves out the launch latency a
    lone call pays between its first event and its first kernel."""
    if burst < 1:
        raise ValueError(f"burst must be at least 1, got {burst}")
    import torch  # noqa: PLC0415

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(burst):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / burst)
    return stat(times)


def round_orders(rounds: int, names: list[str]) -> Iterator[list[str]]:
    """The order of each of ``rounds`` rounds over ``names``: rotated by one each round and
    reversed every other, so that no call always runs first or right after the same one (on
    the H200 a configuration timed first after a compile read 5-8% faster in the ablations'
    A/Bs: benchmarks/ablate.py)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not names:
        raise ValueError("names: at least one call to order")
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        yield order[::-1] if r % 2 else order


def interleaved_ms(calls: dict[str, Callable[[], Any]], rounds: int = 8, reps: int = 3,
                   burst: int = 1, settle_s: float = 2.0) -> dict[str, list[float]]:
    """Per call of ``calls``, its time (ms a call) in each of ``rounds`` rounds, every call timed
    once a round (the median of ``reps`` timings of ``burst`` calls, :func:`cuda_time_ms`) in
    the orders of :func:`round_orders`, after ``settle_s`` seconds of the first call so that
    the clocks are steady. Figures that are compared with each other (a kernel against a peer,
    a variant against another) come from one such set of rounds: timed one after the other,
    each would read what ran before it (docs/benchmarking.md)."""
    if not calls:
        raise ValueError("calls: at least one call to time")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    if settle_s < 0:
        raise ValueError(f"settle_s must be >= 0, got {settle_s}")
    orders = list(round_orders(rounds, list(calls)))
    import torch  # noqa: PLC0415

    first = next(iter(calls.values()))
    until = time.monotonic() + settle_s
    while time.monotonic() < until:
        first()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for order in orders:
        for name in order:
            times[name].append(cuda_time_ms(calls[name], reps, burst=burst))
    return times
