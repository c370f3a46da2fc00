"""Fixtures on a real, private containerd (``gpuzombie.lab.runtime.containerd``): import them into a test
module with ``from containerd_fixture import containerd, kube_pods  # noqa: F401``.

``containerd`` is one instance per test (it starts in about 0.3 s; the autouse ``reap_children``
would kill one shared by several tests); ``kube_pods`` makes kubelet-style pods in it for one
test and, when the test ends (passed or failed), removes them and checks the runtime holds no
sandbox, no container and no process of them. ``pyenv_venv`` is a venv made from a pyenv Python,
an interpreter outside /usr (skipped without one).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the CRI client needs the 'node' extra; conftest.py imports this module without it
    from gpuzombie.k8s.cri import RunningPod, SandboxSpec
    from gpuzombie.lab.runtime.containerd import Containerd
    from gpuzombie.lab.runtime.interpreter import PythonLayout

HAVE_CONTAINERD = all(shutil.which(exe) for exe in ("containerd", "ctr", "runc", "catatonit", "busybox")) and any(
    os.path.isfile(f"{d}/loopback") for d in ("/usr/lib/cni", "/opt/cni/bin")
)
HAVE_CRI_CLIENT = all(importlib.util.find_spec(module) for module in ("grpc", "cri_api"))

needs_containerd = pytest.mark.skipif(
    os.geteuid() != 0 or not HAVE_CONTAINERD or not HAVE_CRI_CLIENT,
    reason="needs root, containerd, runc, catatonit, busybox-static and containernetworking-plugins"
    " (make debian installs them)"
    " and the 'node' extra (grpcio, container-runtime-interface-api)",
)

PodMaker = Callable[["SandboxSpec"], "RunningPod"]


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    pytest.importorskip("cri_api", reason="the CRI client is in the 'node' extra")
    from gpuzombie.lab.runtime.containerd import ContainerdError, private_containerd

    try:
        with private_containerd() as ctd:
            yield ctd
    except ContainerdError as exc:
        pytest.fail(f"private containerd: {exc}")


@pytest.fixture
def kube_pods(containerd: Containerd) -> Iterator[PodMaker]:
    """Make pods with ``kube_pods(SandboxSpec(...))``; all of them are gone after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda spec: stack.enter_context(containerd.pod(spec))
    left = [s.metadata.name for s in containerd.client.list_pod_sandboxes()]
    left += [c.metadata.name for c in containerd.client.list_containers()]
    assert not left, f"left in the runtime: {left}"


def pyenv_pythons() -> list[str]:
    """pyenv's CPython 3.11+ interpreters here (``$PYENV_ROOT``, else ~/.pyenv): installations
    outside /usr, as a newcomer's venv links to."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = []
    for exe in sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3"))):
        minor = os.path.basename(os.path.dirname(os.path.dirname(exe))).split(".")[1]
        if minor.isdigit() and int(minor) >= 11 and os.access(exe, os.X_OK):
            found.append(exe)
    return found


@pytest.fixture
def pyenv_venv(tmp_path: Path) -> PythonLayout:
    """A venv made from a pyenv Python (no pip: fast), as the interpreter reports its own layout."""
    pythons = pyenv_pythons()
    if not pythons:
        pytest.skip("no pyenv CPython 3.11+ here (~/.pyenv/versions/3.*)")
    venv = tmp_path / "pyenv-venv"
    subprocess.run([pythons[0], "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    asked = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
    done = subprocess.run([str(venv / "bin" / "python3"), "-c", asked], capture_output=True, text=True, timeout=60)
    prefixes = json.loads(done.stdout)
    from gpuzombie.lab.runtime.interpreter import PythonLayout

    return PythonLayout(str(venv / "bin" / "python3"), tuple(dict.fromkeys(prefixes)))
