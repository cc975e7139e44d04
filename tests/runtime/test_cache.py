"""CPU tests of the plan cache (tessera.runtime.cache): least recently used out at the capacity,
the capacity from ``tessera.config`` when none is given, fixed-mask keys apart from request keys,
and plans taken out while in use."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import BlockMask
from tessera.runtime.cache import FixedMaskKey, PlanCache, RequestKey


def _plan(seed: int) -> tessera.Plan:
    dense = np.random.default_rng(seed).random((1, 1, 3, 3)) < 0.6
    dense[..., 0, 0] = True
    return tessera.plan(BlockMask.from_dense(dense, block_size=64), num_q_heads=1, head_dim=64)


def _fixed(p: tessera.Plan) -> FixedMaskKey:
    return FixedMaskKey(id(p.mask), (1, 1, 1, 64, "bfloat16", "bhld"), 0)


def test_least_recently_used_plan_leaves_first_at_the_capacity():
    cache = PlanCache(capacity=2)
    plans = [_plan(i) for i in range(3)]
    keys = [_fixed(p) for p in plans]
    cache.keep(keys[0], plans[0])
    cache.keep(keys[1], plans[1])
    assert cache.take(keys[0]) is plans[0]  # taken out while in use ...
    assert cache.take(keys[0]) is None
    cache.keep(keys[0], plans[0])  # ... and back as the most recently used
    cache.keep(keys[2], plans[2])
    assert cache.keys() == [keys[0], keys[2]] and len(cache) == 2
    assert cache.plans() == [plans[0], plans[2]]
    cache.clear()
    assert len(cache) == 0


def test_capacity_none_follows_config(monkeypatch):
    cache = PlanCache()
    plans = [_plan(i) for i in range(3)]
    with tessera.config.override(request_plans_kept=1):
        for p in plans:
            cache.keep(_fixed(p), p)
        assert cache.plans() == [plans[2]]
    with tessera.config.override(request_plans_kept=0):
        cache.keep(_fixed(plans[0]), plans[0])
        assert len(cache) == 0


def test_fixed_mask_and_request_keys_are_apart():
    p = _plan(0)
    fixed = _fixed(p)
    request = RequestKey(0, 0, None, 0, None, (1, 1, 1, 64, "bfloat16", "bhld"), (1, 1),
                         p.mask.q_bounds.tobytes(), p.mask.kv_bounds.tobytes())
    cache = PlanCache(capacity=4)
    cache.keep(fixed, p)
    assert cache.take(request) is None and cache.take(fixed) is p
    assert hash(request.with_selection("x")) != hash(request)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_capacity_is_checked(bad):
    with pytest.raises(ValueError, match="capacity must be None or an int >= 0"):
        PlanCache(capacity=bad)
