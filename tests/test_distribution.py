"""tessera.distribution: the install lines every message gives name the package as it is on the
index (``tessera-attention``), never the unrelated ``tessera``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.distribution import DISTRIBUTION, EXTRAS, install_hint

ROOT = Path(__file__).resolve().parents[1]


def test_install_hints():
    assert install_hint() == "pip install tessera-attention"
    assert install_hint("cuda13") == "pip install 'tessera-attention[cuda13]'"
    assert install_hint("cuda12", "diffusers") == \
        "pip install 'tessera-attention[cuda12,diffusers]'"
    with pytest.raises(ValueError, match="extras must be among cuda13, cuda12"):
        install_hint("cuda11")


def test_pyproject_names_the_distribution_and_its_extras():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert set(project["optional-dependencies"]) == set(EXTRAS)
    assert isinstance(project["license"], str)  # an SPDX expression, not the deprecated table


def test_no_install_line_names_the_other_project():
    """Every ``pip install`` in the package, the docs and the README names tessera-attention or a
    local path."""
    bad = []
    for path in [*ROOT.joinpath("tessera").rglob("*.py"), *ROOT.joinpath("docs").glob("*.md"),
                 ROOT / "README.md"]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pip install\s+['\"]?tessera(?!-attention)[\[\s'\"]", line) or \
                    re.search(r"'tessera\[", line):
                bad.append(f"{path.relative_to(ROOT)}:{i}")
    assert not bad, bad
