"""Tessera: block-sparse attention for video diffusion transformers on NVIDIA GPUs.

The caller's logical block mask (:class:`BlockMask`) is kept as it is; the runtime maps it onto
physical tiles, organizes them into tasks and runs a kernel chosen for the GPU. Importing Tessera
needs only numpy and scipy; CuPy is needed to run on a GPU. ``tessera.reference`` is the
float64 truth, ``tessera.emulate`` runs a plan on the CPU, ``tessera.families`` makes the
masks of published video sparse-attention methods.
"""

from . import families, reference
from .api import attention, attention_backward
from .capture import CapturedMemory, release_captured_memory
from .cuda.device import require_gpu
from .mask import BlockMask
from .runtime import emulate
from .runtime.mode import PlanMode
from .runtime.plan import Plan, plan
from .runtime.regime import BackwardRegime, Regime, use_table
from .runtime.regime.heuristic import INT8_REGIME
from .settings import config

__version__ = "0.1.0"

__all__ = ["BackwardRegime", "BlockMask", "CapturedMemory", "INT8_REGIME", "Plan", "PlanMode",
           "Regime",
           "attention", "attention_backward", "config",
           "emulate", "families", "plan", "reference", "release_captured_memory", "require_gpu",
           "use_table", "__version__"]
