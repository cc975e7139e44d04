"""Argument types of the command line: every value is checked by argparse, so a bad one is a
usage error (exit 2) that says what is accepted, before any work starts."""

from __future__ import annotations

import argparse
import importlib.util
import math
from typing import Callable, Sequence

from ..distribution import install_hint
from ..integrations import presets
from ..integrations.methods import SparseConfig

__all__ = ["positive_int", "nonnegative_int", "positive_float", "fraction", "int_choice",
           "comma_list", "saved_config", "preset_config", "require_matplotlib"]


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def positive_int(text: str) -> int:
    """An int of at least 1."""
    n = _int(text)
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return n


def nonnegative_int(text: str) -> int:
    """An int of at least 0."""
    n = _int(text)
    if n is None or n < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return n


def _number(text: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not (math.isfinite(x) and ok(x)):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return x


def positive_float(text: str) -> float:
    """A finite number above 0."""
    return _number(text, lambda x: x > 0, "a positive number")


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    return _number(text, lambda x: 0 < x <= 1, "a number in (0, 1]")


def int_choice(choices: Sequence[int]) -> Callable[[str], int]:
    """An int among ``choices``."""
    def parse(text: str) -> int:
        n = _int(text)
        if n not in choices:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(map(str, choices))}, got {text!r}")
        return n
    return parse


def comma_list(choices: Sequence[str], extra: Sequence[str] = ()) -> Callable[[str], list[str]]:
    """A comma list of names among ``choices`` (or one of ``extra`` alone, kept as is)."""
    def parse(text: str) -> list[str]:
        if text in extra:
            return [text]
        names = [n for n in text.split(",") if n]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, bad)) or 'empty list'}; choose from "
                f"{', '.join(list(choices) + list(extra))}")
        return names
    return parse


def saved_config(path: str) -> SparseConfig:
    """A configuration file (``SparseConfig.save``), read and checked as an argument."""
    try:
        return SparseConfig.load(path)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def preset_config(name: str) -> SparseConfig:
    """A published setting's configuration (:mod:`tessera.integrations.presets`), by name."""
    try:
        return presets.get(name).config
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def require_matplotlib(ap: argparse.ArgumentParser, option: str) -> None:
    """A usage error for ``option`` when matplotlib is missing: said before the work, not after."""
    if importlib.util.find_spec("matplotlib") is None:
        ap.error(f"{option} needs matplotlib: {install_hint('plot')}")
