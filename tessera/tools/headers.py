"""``python -m tessera.tools.headers``: writes the generated CUDA headers -- ``cuda/queue.cuh``
(the task-queue layout of ``runtime/queue.py``) and ``cuda/sm90/wgmma.cuh`` (``cuda/gen_wgmma.py``).
Run it after changing either source; CPU tests hold the committed headers equal to these."""

from __future__ import annotations

from pathlib import Path

from ..cuda import gen_wgmma
from ..runtime import queue

__all__ = ["generated_headers", "write_headers"]


def generated_headers() -> dict[Path, str]:
    """Each generated header's path and the text it must hold."""
    return {queue.HEADER_PATH: queue.header_text(), gen_wgmma.header_path(): gen_wgmma.render()}


def write_headers() -> list[Path]:
    """Write every generated header; returns the paths written."""
    written = []
    for path, text in generated_headers().items():
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_headers():
        print(f"wrote {path}")
