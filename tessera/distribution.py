"""The name Tessera installs under and the install lines its messages give.

The import name is ``tessera``; the distribution on the package index is ``tessera-attention``
(``tessera`` there is another project). Every hint that tells a user what to install comes from
:func:`install_hint`, so none names the other project.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "EXTRAS", "install_hint"]

DISTRIBUTION = "tessera-attention"

# The optional extras of pyproject.toml, and what each brings.
EXTRAS = {
    "cuda13": "CuPy for CUDA 13 drivers with the CUDA wheels it needs (NVRTC)",
    "cuda12": "CuPy for CUDA 12 drivers with the CUDA wheels it needs (NVRTC)",
    "test": "pytest, pytest-benchmark and Hypothesis",
    "plot": "matplotlib, for drawing plans",
    "diffusers": "torch and diffusers, for tessera.integrations.diffusers and `pipeline`",
}


def install_hint(*extras: str) -> str:
    """The pip command that installs Tessera with ``extras`` (none: the CPU-only package)."""
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        raise ValueError(f"extras must be among {', '.join(EXTRAS)}, got {unknown}")
    if not extras:
        return f"pip install {DISTRIBUTION}"
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"
