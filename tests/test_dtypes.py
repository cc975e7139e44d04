"""tessera.dtypes: every spelling of the two dtypes accepted, anything else refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.dtypes import checked_dtype, dtype_name


class _TorchDtype:
    """What a torch dtype looks like to Tessera without PyTorch: its str()."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@pytest.mark.parametrize("spelling, want", [
    ("bfloat16", "bfloat16"), ("bf16", "bfloat16"), ("BF16", "bfloat16"),
    (_TorchDtype("torch.bfloat16"), "bfloat16"), ("float16", "float16"), ("fp16", "float16"),
    ("half", "float16"), (np.float16, "float16"), (np.dtype("float16"), "float16"),
    (_TorchDtype("torch.float16"), "float16"), ("jnp.bfloat16", "bfloat16")])
def test_every_spelling_of_the_two_dtypes(spelling, want):
    assert checked_dtype(spelling) == want
    mask = tessera.BlockMask.from_dense(np.ones((1, 1), bool), block_size=64)
    assert tessera.plan(mask, num_q_heads=1, head_dim=64, dtype=spelling).dtype == want


@pytest.mark.parametrize("bad", ["float32", np.float32, np.dtype("int8"), "complex64",
                                 _TorchDtype("torch.float32"), None, 3])
def test_other_dtypes_refused_by_name(bad):
    with pytest.raises(TypeError, match="dtype must be bfloat16 or float16"):
        checked_dtype(bad)
    mask = tessera.BlockMask.from_dense(np.ones((1, 1), bool), block_size=64)
    with pytest.raises(TypeError, match="dtype must be bfloat16 or float16"):
        tessera.plan(mask, num_q_heads=1, head_dim=64, dtype=bad)


def test_dtype_name_keeps_unknown_spellings_for_the_message():
    assert dtype_name("float32") == "float32" and dtype_name(np.int8) == "int8"
