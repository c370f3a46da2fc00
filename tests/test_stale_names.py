"""A deleted pod's GPU holder keeps the pod's names on the exporter's series (issue 26 item 5), on a
real containerd through its CRI socket: the exporter saw the pod ``ml/gone-0`` while it ran; the pod
is then deleted (stopped and removed) while a process in its cgroup keeps /dev/nvidia0 open, and a
new pod starts, so the exporter asks the runtime again, which no longer lists ``gone-0``. The stale
holder's series must still say namespace="ml", pod="gone-0", which GpuzombieStaleGpuHolder shows
(a884539 served pod="" and its alert named the uid alone). The kubelet's PodResources is the named
stand-in of tests/test_stale.py."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")

from containerd_fixture import needs_containerd
from gpuzombie.k8s import names as names_module
from gpuzombie.k8s.cri import SandboxSpec
from gpuzombie.k8s.names import RuntimeNames
from test_stale import kubelet, start_survivor  # noqa: F401  (kubelet: the stand-in's fixture)

pytestmark = needs_containerd


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def stale_lines(text: str, pod_uid: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dirty_gpu_holders{") and f'pod_uid="{pod_uid}"' in line and 'kind="stale"' in line
    ]


def test_a_stale_holder_of_a_deleted_pod_keeps_the_pods_names(containerd, kube_pods, kubelet):  # noqa: F811
    doomed = containerd.start_pod(SandboxSpec(name="gone-0", namespace="ml"))
    kubelet[("ml", "gone-0")] = {}
    survivor = start_survivor(doomed.spec)
    exporter = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuzombie", "exporter", "--listen", "127.0.0.1:0", "--min-interval", "0"),
            *("--cri-socket", containerd.socket),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", exporter.stderr.readline()).group(1))
        assert not stale_lines(scrape(port), doomed.spec.uid)  # its pod runs: the exporter sees its names

        del kubelet["ml", "gone-0"]  # the kubelet's deletion, then the runtime's
        containerd.stop_pod(doomed)
        kubelet[("ml", "next-0")] = {}
        kube_pods(SandboxSpec(name="next-0", namespace="ml"))  # a new sandbox: the runtime is asked again
        (line,) = stale_lines(scrape(port), doomed.spec.uid)
        assert 'namespace="ml"' in line and 'pod="gone-0"' in line, line
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
        exporter.stderr.close()
        survivor.kill()
        survivor.wait()


def test_the_names_kept_are_bounded_the_oldest_forgotten_first(containerd, monkeypatch):
    """With room for one gone pod: after two deletions the first pod's names are forgotten, the
    second's kept (each scan sees a new sandbox, so the runtime is asked each time)."""
    monkeypatch.setattr(names_module, "MAX_REMEMBERED", 1)
    names = RuntimeNames(containerd.socket)
    first = containerd.start_pod(SandboxSpec(name="first-0", namespace="ml"))
    assert names([first.sandbox_id]).pod(first.spec.uid).pod == "first-0"
    second = containerd.start_pod(SandboxSpec(name="second-0", namespace="ml"))
    containerd.stop_pod(first)
    got = names([second.sandbox_id])
    assert got.pod(first.spec.uid).pod == "first-0" and got.container(first.sandbox_id) is None  # not asked for
    with containerd.pod(SandboxSpec(name="third-0", namespace="ml")) as third:
        containerd.stop_pod(second)
        got = names([third.sandbox_id, first.sandbox_id, second.sandbox_id])
        assert got.pod(first.spec.uid) is None and got.container(first.sandbox_id) is None
        assert got.pod(second.spec.uid).pod == "second-0" and got.container(second.sandbox_id).pod == "second-0"
    names.close()
