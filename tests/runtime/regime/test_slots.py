"""CPU tests of task slots (tessera.runtime.regime.slots): tasks in flight."""

from __future__ import annotations

from tessera import Regime


def test_tasks_in_flight_estimates():
    """Resident CTAs per SM from shared memory and threads, times the SMs."""
    from tessera.runtime.regime import default_regime, tasks_in_flight

    ws = default_regime(90, 128)  # ~225 KB: one CTA per SM
    assert tasks_in_flight(ws, 128, 90, 132) == 132
    assert tasks_in_flight(default_regime(90, 128, q_block=64), 128, 90, 132) == 264
    assert tasks_in_flight(Regime(block_m=64, num_warps=4), 64, 90, 132) >= 264
    # A variant larger than the architecture allows still counts one per SM.
    assert tasks_in_flight(ws, 128, 86, 84) == 84
