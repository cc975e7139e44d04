"""The element types and head dims the kernels run, and the spellings of a dtype Tessera accepts."""

from __future__ import annotations

from typing import Any

__all__ = ["SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS", "dtype_name"]

SUPPORTED_DTYPES = ("bfloat16", "float16")
# Head dims with a compiled kernel in every family (the kernels' D template value).
SUPPORTED_HEAD_DIMS = (64, 96, 128)


def dtype_name(dtype: Any) -> str:
    """The canonical name of a dtype given as a string ("bf16", "half", ...), a numpy/CuPy/JAX
    dtype or a torch dtype; unknown spellings come back as they are, for the caller's check."""
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "").replace("jnp.", "")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    return aliases.get(name, name)
