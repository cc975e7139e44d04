"""The published settings (tessera.integrations.presets): each names its source, saves and
loads as a configuration, and makes a sparse mask at the resolution it was published for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tessera.integrations import methods as M
from tessera.integrations import presets


def test_every_preset_names_its_source_and_is_found_by_name():
    names = [p.name for p in presets.PRESETS]
    assert len(set(names)) == len(names)
    for p in presets.PRESETS:
        assert presets.get(p.name) is p
        assert "/" in p.config.source and p.model and p.resolution  # a repository's file
    with pytest.raises(ValueError, match="unknown preset 'nope'; choose from hunyuan"):
        presets.get("nope")


@pytest.mark.parametrize("preset", presets.PRESETS, ids=lambda p: p.name)
def test_each_preset_saves_and_masks_its_resolution_sparsely(preset, tmp_path):
    """The configuration round-trips through JSON, and the method's mask at the published
    latent grid keeps between 2% and 70% of the pairs (sparse, not empty)."""
    path = tmp_path / "preset.json"
    preset.config.save(path)
    assert M.SparseConfig.load(path) == preset.config
    geo = M.VideoGeometry(preset.latent)
    q = k = None
    if preset.config.method.dynamic:
        rng = np.random.default_rng(0)
        q, k = (rng.standard_normal((1, geo.tokens, 16)).astype(np.float32) for _ in range(2))
    density = preset.config.method.layer_mask(geo, q, k).mask.density
    assert 0.02 < density < 0.7, density


def test_the_guide_lists_every_preset():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    missing = [p.name for p in presets.PRESETS if f"`{p.name}`" not in guide]
    assert not missing, missing
