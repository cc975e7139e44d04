"""GPU tests of the video mask families (tessera.families): device paths equal host paths."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import families as M
from tests.families.families_helpers import dense, is_permutation, separated_qk


@pytest.mark.gpu
def test_device_paths_match_host():
    import cupy as cp

    lat, cube = (5, 6, 7), (4, 4, 4)
    rng = np.random.default_rng(7)
    q = 2 * rng.standard_normal((2, 3, 215, 16)).astype(np.float32)
    k = 2 * rng.standard_normal((2, 3, 215, 16)).astype(np.float32)
    for kw in (dict(topk=3), dict(top_p=0.8)):
        h = M.topk_pooled(q, k, lat, cube=cube, text_tokens=5, text_valid=3, **kw)
        d = M.topk_pooled(cp.asarray(q), cp.asarray(k), lat, cube=cube, text_tokens=5,
                          text_valid=3, **kw)
        assert d.mask.on_device and isinstance(d.permutation, np.ndarray)
        assert np.array_equal(cp.asnumpy(d.mask.to_dense()), dense(h)), kw
        assert np.array_equal(d.permutation, h.permutation)
        assert np.array_equal(d.mask.q_bounds, h.mask.q_bounds)
    qs, ks, _, _ = separated_qk(np.random.default_rng(3))
    h = M.semantic_clusters(qs, ks, 3, 4, top_p=0.9, min_fraction=0.25)
    d = M.semantic_clusters(cp.asarray(qs), cp.asarray(ks), 3, 4, top_p=0.9, min_fraction=0.25)
    assert d.mask.on_device
    assert np.array_equal(d.permutation, h.permutation)
    assert np.array_equal(d.kv_permutation, h.kv_permutation)
    assert np.array_equal(cp.asnumpy(d.mask.to_dense()), dense(h))
    qr = cp.asarray(rng.standard_normal((2, 300, 8)).astype(np.float32))
    vm = M.semantic_clusters(qr, qr * 2, 6, 20, text_tokens=4, text_valid=2)
    assert is_permutation(vm.permutation, 300) and is_permutation(vm.kv_permutation, 300)
    assert (cp.asnumpy(vm.mask.to_dense())[0, :, :-2, :-2].sum(-1) >= 2).all()
