"""Plan pictures (CPU): a plan with merges and splits draws to a valid PNG."""

import numpy as np
import pytest

import tessera
from tessera.runtime.regime import Regime

pytest.importorskip("matplotlib")


def test_draw_plan_writes_png(tmp_path):
    from tessera.tools.plot import draw_plan

    rng = np.random.default_rng(0)
    dense = rng.random((2, 12, 20)) < 0.2
    dense[:, 3] = True  # a heavy row, split below
    m = tessera.BlockMask.from_dense(dense, block_size=64, seq_len_q=740, seq_len_kv=1250)
    p = tessera.plan(m, num_q_heads=2, head_dim=128,
                     regime=Regime(split_ratio=1.0, min_split_chunks=2))
    assert p.queue.combine.shape[0] > 0
    out = draw_plan(p, tmp_path / "plan.png", head=1)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
