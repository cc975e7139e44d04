"""Argument checks the entry points share: counts and fractions, refused by name.

A count must be a Python or numpy integer -- never a bool, a float that would be truncated, or a
string -- and a fraction a real number; a wrong kind is a TypeError, a value out of range a
ValueError, each naming the argument and what is accepted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["is_int", "check_int", "check_fraction"]


def is_int(x: Any) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_int(value: Any, name: str, minimum: int | None = None) -> int:
    """``value`` as an int: a Python or numpy integer (never a bool, a float that would be
    truncated, or a string), at least ``minimum``; TypeError or ValueError naming ``name``."""
    if not is_int(value):
        raise TypeError(f"{name} must be {_int_kind(minimum)}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {_int_kind(minimum)}, got {value!r}")
    return int(value)


def _int_kind(minimum: int | None) -> str:
    return ("an int" if minimum is None else "a positive int" if minimum == 1 else
            f"an int >= {minimum}")


def check_fraction(value: Any, name: str, *, zero: bool = False) -> float:
    """``value`` as a float in (0, 1] (``[0, 1]`` with ``zero``): a real number, not a bool or a
    string; TypeError or ValueError naming ``name``."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float, np.integer,
                                                                        np.floating)):
        raise TypeError(f"{name} must be a number in {'[' if zero else '('}0, 1], got "
                        f"{value!r}")
    v = float(value)
    if not ((0.0 <= v if zero else 0.0 < v) and v <= 1.0):
        raise ValueError(f"{name} must be in {'[' if zero else '('}0, 1], got {value!r}")
    return v
