"""Tessera vs dense SDPA (cuDNN, flash) vs FlexAttention, in one process (see tessera/bench.py).

``python benchmarks/compare.py [--shape ...] [--case ...] [--json FILE] [--png FILE]`` is the
same as ``python -m tessera bench``.
"""

import sys

from tessera.bench import main

if __name__ == "__main__":
    sys.exit(main())
