"""The main job's CPU behaviour: ``python -m tessera info`` works with or without a GPU."""

import subprocess
import sys

import tessera
from tessera.__main__ import main


def test_info_in_process(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"Tessera {tessera.__version__}" in out
    assert "sm_90a" in out and "Regime tables" in out and "GPU" in out


def test_info_as_module():
    res = subprocess.run([sys.executable, "-m", "tessera", "info"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Default regime for head dim 128" in res.stdout
