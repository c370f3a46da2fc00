"""Fixtures on a real, private containerd (``gpuzombie.lab.runtime.containerd``): import them into a test
module with ``from containerd_fixture import containerd, kube_pods  # noqa: F401``.

``containerd`` is one instance per test (it starts in about 0.3 s; the autouse ``reap_children``
would kill one shared by several tests); ``kube_pods`` makes kubelet-style pods in it for one
test and, when the test ends (passed or failed), removes them and checks the runtime holds no
sandbox, no container and no process of them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the CRI client needs the 'node' extra; conftest.py imports this module without it
    from gpuzombie.k8s.cri import PodSpec, RunningPod
    from gpuzombie.lab.runtime.containerd import Containerd

HAVE_CONTAINERD = all(shutil.which(exe) for exe in ("containerd", "ctr", "runc", "catatonit", "busybox"))
HAVE_CRI_CLIENT = all(importlib.util.find_spec(module) for module in ("grpc", "cri_api"))

needs_containerd = pytest.mark.skipif(
    os.geteuid() != 0 or not HAVE_CONTAINERD or not HAVE_CRI_CLIENT,
    reason="needs root, containerd, runc, catatonit and busybox-static (make debian installs them)"
    " and the 'node' extra (grpcio, container-runtime-interface-api)",
)

PodMaker = Callable[["PodSpec"], "RunningPod"]


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
    """Make pods with ``kube_pods(PodSpec(...))``; all of them are gone after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda spec: stack.enter_context(containerd.pod(spec))
    left = [s.metadata.name for s in containerd.client.list_pod_sandboxes()]
    left += [c.metadata.name for c in containerd.client.list_containers()]
    assert not left, f"left in the runtime: {left}"
