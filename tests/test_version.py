"""The version is written once (``mmfront/_version.py``): the package, the build and the
changelog all read that one value."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import mmfront
from mmfront import _version

REPO = Path(__file__).resolve().parents[1]


def test_package_version_is_the_version_module() -> None:
    assert mmfront.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", _version.__version__)


def test_pyproject_reads_the_version_module() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mmfront._version.__version__"}


def test_installed_metadata_has_the_version() -> None:
    assert importlib.metadata.version("mmfront") == mmfront.__version__, "reinstall: pip install -e ."


def test_changelog_has_a_section_for_the_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(mmfront.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{mmfront.__version__}]")
