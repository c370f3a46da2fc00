"""What a newcomer meets first, outside the code: ``make help``, the package metadata, the dependency list."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from docs import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

# Distribution -> the module it installs, for the runtime dependencies.
MODULES = {"nvidia-ml-py": "pynvml", "click": "click", "rich": "rich"}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_shows_no_unexpanded_variable():
    done = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert "proto" in done.stdout and "$(" not in done.stdout, done.stdout


def test_the_license_is_an_spdx_expression():
    """A table (``{ text = ... }``) is deprecated by setuptools >= 77, with a warning three times per install."""
    assert PROJECT["license"] == "Apache-2.0"


def test_every_runtime_dependency_is_imported_by_the_package():
    names = [re.match(r"[A-Za-z0-9_.-]+", spec)[0].lower() for spec in PROJECT["dependencies"]]
    assert set(names) == set(MODULES), "a new dependency: name its module in MODULES"
    source = "\n".join(path.read_text() for path in (REPO / "src" / "gpuzombie").rglob("*.py"))
    for name in names:
        assert re.search(rf"^\s*(import|from) {MODULES[name]}\b", source, re.MULTILINE), f"{name} is never imported"
