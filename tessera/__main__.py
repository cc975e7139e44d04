"""``python -m tessera``: the command line (``tessera/tools/cli.py``)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
