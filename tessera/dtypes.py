"""The element types and head dims the kernels run, and the spellings of a dtype Tessera accepts."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS", "dtype_name", "checked_dtype"]

SUPPORTED_DTYPES = ("bfloat16", "float16")
# Head dims with a compiled kernel in every family (the kernels' D template value).
SUPPORTED_HEAD_DIMS = (64, 96, 128)
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "f16": "float16"}


def dtype_name(dtype: Any) -> str:
    """The canonical name of a dtype given as a string ("bf16", "half", ...), a numpy/CuPy/JAX
    dtype or scalar type (``np.float16``, ``np.dtype("float16")``, ``jnp.bfloat16``) or a torch
    dtype; a spelling it does not know comes back as it reads, for the caller's message."""
    if isinstance(dtype, str):
        name = dtype
    else:
        name = getattr(dtype, "name", None)  # numpy / CuPy / ml_dtypes dtype objects
        if not isinstance(name, str):
            try:  # scalar types: np.float16, cp.float16, ml_dtypes.bfloat16, jnp.bfloat16
                name = np.dtype(dtype).name
            except TypeError:
                name = str(dtype)  # torch.float16 -> "torch.float16"
    name = name.strip().lower()
    for prefix in ("torch.", "jnp.", "numpy.", "np."):
        name = name.removeprefix(prefix)
    return _ALIASES.get(name, name)


def checked_dtype(dtype: Any, name: str = "dtype") -> str:
    """:func:`dtype_name` of ``dtype``, refused by name unless it is bfloat16 or float16."""
    canonical = dtype_name(dtype)
    if canonical not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be bfloat16 or float16 (as a string such as 'bf16' or "
                        f"'float16', a numpy/CuPy/JAX or torch dtype), got {dtype!r}")
    return canonical
