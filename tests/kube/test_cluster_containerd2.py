"""The single-node cluster on containerd 2.4.2 (GPUZOMBIE_CLUSTER_RUNTIME=containerd2, built from
go/containerd): Ready, the kubelet takes its cgroup driver from the runtime (RuntimeConfig), the
runtime restricts the pause container's oom_score_adj (no CAP_SYS_RESOURCE here), NRI listens inside
the cluster's directory, a pod runs on the bridge, and ``down`` leaves nothing.

Its own cluster, module-scoped, beside the session's (instance N+3: its own ports, bridge, pod
subnet and cgroup root). When containerd 2 is not in ~/.cache/gpuzombie/containerd the fixture
builds it first: ~6 min cold on two loaded cores (docs/kubernetes.md), hence the module's timeout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from cri_api.v1.api_pb2_grpc import RuntimeServiceStub

from gpuzombie.cluster.layout import DEFAULT_SHIM_SOCKET_DIR, Layout
from gpuzombie.lab.runtime.rundirs import cgroup_roots
from kube.conftest import CONTAINERD2_BUILD_TIMEOUT_S, UP_TIMEOUT_S, Kube, containerd2_cluster

pytestmark = pytest.mark.timeout(CONTAINERD2_BUILD_TIMEOUT_S + UP_TIMEOUT_S)
BUSYBOX = "localhost/gpuzombie/busybox:static"
CNI_CACHE = Path("/var/lib/cni/results")


@pytest.fixture(scope="module")
def kube2() -> Iterator[Kube]:
    with containerd2_cluster("ctd2") as kube:
        yield kube


def _layout(kube: Kube) -> Layout:
    return Layout(kube.root, int(kube.env["GPUZOMBIE_CLUSTER_INSTANCE"]), "containerd2")


def _cri_status(layout: Layout) -> pb.StatusResponse:
    with grpc.insecure_channel(f"unix://{layout.containerd_socket}") as channel:
        return RuntimeServiceStub(channel).Status(pb.StatusRequest(verbose=True), timeout=10)


def test_node_is_ready_on_containerd_2(kube2: Kube) -> None:
    node = kube2.get("node", "gpuzombie-node")
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://2.4.2"
    status = json.loads(kube2.cli("cluster", "status", "--json").stdout)
    assert status["up"] and status["containerd_version"] == "v2.4.2"


def test_the_kubelet_takes_the_cgroup_driver_from_the_runtime(kube2: Kube) -> None:
    log = (kube2.root / "logs" / "kubelet.log").read_text(errors="replace")
    assert "Using cgroup driver setting received from the CRI runtime" in log
    assert "Falling back to using cgroupDriver" not in log  # what it logs on containerd 1.6


def test_the_runtime_restricts_oom_score_adj_and_serves_nri_inside(kube2: Kube) -> None:
    layout = _layout(kube2)
    config = json.loads(_cri_status(layout).info["config"])  # what `crictl info` shows
    assert config["restrictOOMScoreAdj"] is True
    assert layout.nri_socket.is_socket()  # not /var/run/nri/nri.sock
    assert f"export GPUZOMBIE_NRI_SOCKET={layout.nri_socket}" in kube2.cli("cluster", "env").stdout
    assert 'Registered namespace \\"k8s.io\\" with NRI' in (kube2.root / "logs" / "containerd.log").read_text()


def _pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {"name": "c", "image": BUSYBOX, "command": ["/bin/sh", "-c", "trap '' TERM; sleep 600 & wait"]}
            ],
        },
    }


def test_a_pod_runs_with_its_shim_and_runc_state_inside(kube2: Kube) -> None:
    """Two pods: one deleted (the kubelet's grace), one left running for ``down``."""
    layout = _layout(kube2)
    applied = subprocess.run(
        [str(kube2.root / "bin" / "kubectl"), "apply", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [_pod("on-ctd2"), _pod("kept")]}),
        env=kube2.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    kube2.kubectl("wait", "--for=condition=Ready", "pod/on-ctd2", "pod/kept", "--timeout=120s")
    assert kube2.get("pod", "on-ctd2")["status"]["podIP"].startswith(f"10.98.{layout.instance}.")
    assert any(p.is_socket() for p in Path(layout.shim_socket_dir).iterdir())
    assert len(os.listdir(layout.runc_root / "k8s.io")) == 4  # each pod's pause container and c
    # -998 restricted to containerd's own score: the sandboxes ran at all (no CAP_SYS_RESOURCE)
    processes = json.loads((kube2.root / "state.json").read_text())["processes"]
    containerd = next(p["pid"] for p in processes if p["name"] == "containerd")
    own = Path(f"/proc/{containerd}/oom_score_adj").read_text().strip()
    assert [_pause_oom_score_adj(layout, s) for s in _sandbox_ids(layout)] == [own, own]
    # exec through the kubelet to containerd 2's streaming server (on loopback)
    assert kube2.kubectl("exec", "kept", "--", "cat", "/proc/1/oom_score_adj").stdout.strip() == "1000"  # BestEffort
    began = time.monotonic()
    kube2.kubectl("delete", "pod", "on-ctd2", "--wait=true", "--timeout=120s")
    assert time.monotonic() - began >= 2.0  # the grace waited out: sh ignored SIGTERM


def _pause_oom_score_adj(layout: Layout, sandbox: str) -> str:
    with grpc.insecure_channel(f"unix://{layout.containerd_socket}") as channel:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox, verbose=True)
        status = RuntimeServiceStub(channel).PodSandboxStatus(request, timeout=10)
    return Path(f"/proc/{json.loads(status.info['info'])['pid']}/oom_score_adj").read_text().strip()


def _sandbox_ids(layout: Layout) -> list[str]:
    try:
        return os.listdir(layout.containerd / "root" / "io.containerd.grpc.v1.cri" / "sandboxes")
    except OSError:
        return []


def _leftovers(layout: Layout, sandboxes: list[str]) -> dict[str, object]:
    root = str(layout.root)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" ")[4] for line in f if root in line]
    processes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if root.encode() + b"/" in cmdline:
            processes.append(pid)
    bridge = subprocess.run(["ip", "-o", "link", "show", layout.bridge], capture_output=True, text=True, check=False)
    cached = os.listdir(CNI_CACHE) if CNI_CACHE.is_dir() else []
    # containerd's shim socket name, wherever the socket dir: sha256(<address>/<namespace>/<id>)
    shims = [hashlib.sha256(f"{layout.containerd_socket}/k8s.io/{i}".encode()).hexdigest() for i in sandboxes]
    return {
        "mounts": mounts,
        "processes": processes,
        "bridge": bridge.stdout.strip(),
        "dir": layout.root.exists(),
        "cgroups": [h for h in cgroup_roots() if os.path.exists(h + layout.cgroup_root)],
        "cni cache": [n for n in cached for i in sandboxes if f"-{i}-" in n],
        "shim sockets": [s for s in shims if os.path.exists(f"{DEFAULT_SHIM_SOCKET_DIR}/{s}")],
    }


def test_down_leaves_nothing(kube2: Kube) -> None:
    layout = _layout(kube2)
    sandboxes = _sandbox_ids(layout)
    assert sandboxes, "no pod sandbox is there (the kept pod's)"
    down = kube2.cli("cluster", "down")
    assert "removed" in down.stderr
    assert _leftovers(layout, sandboxes) == {
        "mounts": [],
        "processes": [],
        "bridge": "",
        "dir": False,
        "cgroups": [],
        "cni cache": [],
        "shim sockets": [],
    }
