"""CPU tests of tessera.config (tessera/settings.py): checked switches, overrides restored."""

from __future__ import annotations

import numpy as np
import pytest

import tessera


def test_numpy_scalars_are_taken_as_python_values():
    """A numpy int or bool is accepted where the Python one is (every other entry point
    takes them), and stored as the Python value."""
    with tessera.config.override(request_plans_kept=np.int64(3), use_tma=np.bool_(False)):
        assert tessera.config.request_plans_kept == 3
        assert type(tessera.config.request_plans_kept) is int
        assert tessera.config.use_tma is False
    assert tessera.config.request_plans_kept == 8 and tessera.config.use_tma is True


def test_override_restores_even_after_an_error():
    with pytest.raises(RuntimeError):
        with tessera.config.override(persistent_grid_cap=3):
            raise RuntimeError
    assert tessera.config.persistent_grid_cap is None


def test_override_refuses_unknown_and_bad_settings_before_changing_any():
    with pytest.raises(TypeError, match=r"unknown settings \['bogus'\]"):
        with tessera.config.override(use_tma=False, bogus=1):
            pass
    with pytest.raises(ValueError, match="config.request_selection_refresh must be an int >= 1"):
        with tessera.config.override(request_selection_refresh=0):
            pass
    assert tessera.config.use_tma is True and tessera.config.request_selection_refresh == 16
