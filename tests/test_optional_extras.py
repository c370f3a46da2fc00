"""The suite collects without the optional extras: a module that needs one skips, it never fails collection.

The GPU device runs ``pytest -m gpu tests`` with its own python3 (pytest, psutil, torch, nvidia-ml-py, no
chart, no CRI stubs, no hypothesis): one module importing a missing extra at collection time stopped every
GPU test there (issue 18). Here the extras' top-level modules are made unimportable in a child pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Top-level modules of every extra in pyproject.toml and of the test extra's libraries; left importable:
# pytest and psutil (the harness), click, rich and nvidia-ml-py (the package's own dependencies).
OPTIONAL = (
    "matplotlib",  # plot
    "grpc",
    "google",
    "cri_api",  # node
    "prometheus_client",  # exporter
    "dumb_init",  # init
    "textual",  # top
    "helm_python",
    "kubernetes_validate",
    "yaml",
    "dockerfile_parse",
    "jsonschema",  # chart
    "cryptography",  # cluster
    "jsonpatch",
    "jsonpointer",
    "ruamel",  # admission (webhook --patch)
    "hypothesis",
    "build",
    "grpc_tools",
    "torch",  # test
)

# Each finder answers "not found" for those names, as it would without them installed: imports raise
# ModuleNotFoundError and importlib.util.find_spec returns None.
BLOCKER = """
import sys

class Without:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)

sys.meta_path[:] = [Without(finder) for finder in sys.meta_path]
"""


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_collection_without_any_extra_skips_cleanly(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(OPTIONAL)))
    path = os.pathsep.join([str(tmp_path), str(REPO / "src"), str(REPO / "tests")])
    # No plugin autoload: hypothesis' and pytest-timeout's plugins are extras too (the device has neither).
    env = {**os.environ, "PYTHONPATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--co", "-q", "-rs", "-p", "no:cacheprovider", "tests"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "ERROR" not in out, out
    assert "hypothesis is in the 'test' extra" in out, "the extras were not hidden: " + out
    assert "tests/gpu/test_observe_gpu.py::" in out, "the GPU tests must still be collected: " + out
