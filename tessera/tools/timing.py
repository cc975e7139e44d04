"""GPU timing for the offline tools (the bench driver, the profiler): CUDA events around calls,
after a warm-up, the median of repeats."""

from __future__ import annotations

import statistics
from typing import Any, Callable

__all__ = ["cuda_time_ms"]


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
