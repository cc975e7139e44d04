"""Shared by the regime, profiler and device tests (not a test module): the autouse fixture that
starts every test from clean regime selection, and small builders of features and table
entries."""

from __future__ import annotations

import json

import pytest

from tessera.cuda import device as D
from tessera.runtime import regime as R
from tessera.runtime.regime import MaskFeatures, Regime


@pytest.fixture(autouse=True)
def clean_selection(monkeypatch):
    """Every test starts from discovery with no env var and no GPU name (deterministic on GPU
    machines too), and leaves it that way."""
    monkeypatch.delenv(R.ENV_TABLE, raising=False)
    monkeypatch.setattr(D, "current_gpu_name", lambda: None)
    R.use_table("auto")
    yield
    R.use_table("auto")


def planned_heuristic(mask, arch: int = 90, head_dim: int = 128, num_q_heads: int = 2) -> Regime:
    """What a plan of ``mask`` takes without a table: the heuristic's rules, the ring rule
    counting this machine's SMs (none without a GPU)."""
    return R.heuristic_choice(mask, arch, head_dim, num_q_heads=num_q_heads,
                              sm_count=R.ring_rule_sm_count(arch))[0]


def feats(**kw) -> MaskFeatures:
    base = dict(arch=90, head_dim=128, dtype="bfloat16", geometry="uniform-128x128",
                seq_len="<=32k", density="5-15%", imbalance="<1.5", batch_heads="<=16")
    base.update(kw)
    return MaskFeatures(**base)


def entry(f: MaskFeatures, regime: Regime, ms: float = 1.0, **extra) -> dict:
    return dict(features=f.to_dict(), regime=regime.to_dict(), ms=ms, oracle_ms=ms, **extra)


def _write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _profiled_entry(f: MaskFeatures, rels: dict[Regime, float], masks: int = 1) -> dict:
    """An entry as the profiler writes it: every candidate's mean relative time."""
    best = min(rels, key=lambda r: (rels[r], r.name))
    return {"features": f.to_dict(), "regime": best.to_dict(), "ms": 1.0, "oracle_ms": 1.0,
            "masks": [f"m{i}" for i in range(masks)],
            "candidates": {r.name: {"ms": v, "kernel_ms": v, "plan_ms": 0.0, "rel": v}
                           for r, v in rels.items()}}
