"""The real single-node cluster itself: Ready, its status and env, a pod on its network, the
kubelet's grace period, and a clean ``down`` (also after a SIGKILL of ``up``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuzombie_cli import run_gpuzombie
from kube.conftest import Kube

BUSYBOX = "localhost/gpuzombie/busybox:static"


def _pod(name: str, command: str, grace: int = 2) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": grace,
                "containers": [{"name": "c", "image": BUSYBOX, "command": ["/bin/sh", "-c", command]}],
            },
        }
    )


def apply(kube: Kube, manifest: str) -> None:
    done = subprocess.run(
        [str(kube.root / "bin" / "kubectl"), "apply", "-f", "-"],
        input=manifest,
        env=kube.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_node_is_ready_with_the_built_versions(kube: Kube) -> None:
    node = kube.get("node", "gpuzombie-node")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.37")
    status = json.loads(kube.cli("cluster", "status", "--json").stdout)
    assert status["up"] and set(status["processes"]) >= {"etcd", "kube-apiserver", "kubelet", "containerd"}


def test_env_points_a_shell_at_the_cluster(kube: Kube) -> None:
    lines = kube.cli("cluster", "env").stdout.splitlines()
    exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert Path(exported["KUBECONFIG"]) == kube.kubeconfig
    assert Path(exported["GPUZOMBIE_CRI_SOCKET"]).is_socket()
    assert Path(exported["GPUZOMBIE_POD_RESOURCES_SOCKET"]).is_socket()


def test_a_pod_runs_on_the_bridge_and_its_deletion_waits_out_the_grace(kube: Kube) -> None:
    apply(kube, _pod("grace", "trap '' TERM; sleep 600 & wait; sleep 600", grace=2))
    kube.kubectl("wait", "--for=condition=Ready", "pod/grace", "--timeout=120s")
    pod = kube.get("pod", "grace")
    assert pod["status"]["podIP"].startswith("10.98.")
    began = time.monotonic()
    kube.kubectl("delete", "pod", "grace", "--wait=true", "--timeout=120s")
    took = time.monotonic() - began
    assert took >= 2.0  # the kubelet waited out the grace before its SIGKILL: sh ignored SIGTERM


def test_up_refuses_a_second_cluster_in_one_line(kube: Kube) -> None:
    done = kube.cli("cluster", "up", check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "already up" in done.stderr


def _leftovers(root: Path, bridge: str) -> dict[str, object]:
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" ")[4] for line in f if str(root) in line]
    processes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() + b"/" in cmdline:
            processes.append(pid)
    links = subprocess.run(["ip", "-o", "link", "show", bridge], capture_output=True, text=True, check=False).stdout
    return {"mounts": mounts, "processes": processes, "bridge": links.strip(), "dir": root.exists()}


def test_down_after_a_sigkill_of_up_leaves_nothing(tmp_path: Path) -> None:
    """A second cluster (instance N+5 beside the session's N: its own ports, bridge and cgroup root)
    whose ``up`` is SIGKILLed once the API server answers; ``down`` then removes everything from the
    directory alone."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root = Path("/var/lib") / f"gpuzombie-cluster-killed-{os.getpid()}"
    src = str(Path(__file__).resolve().parents[2] / "src")
    instance = (int(os.environ.get("GPUZOMBIE_CLUSTER_INSTANCE", "0")) + 5) % 10
    env = dict(os.environ, GPUZOMBIE_CLUSTER_DIR=str(root), GPUZOMBIE_CLUSTER_INSTANCE=str(instance), PYTHONPATH=src)
    up = subprocess.Popen(
        [sys.executable, "-m", "gpuzombie", "cluster", "up"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert up.stderr is not None
    for line in up.stderr:  # the progress lines: kill it half-way, with a control plane running
        if "kube-apiserver ready" in line:
            up.send_signal(signal.SIGKILL)
            break
    up.wait(60)
    assert _leftovers(root, f"gzcluster{instance}")["processes"], "nothing ran when up was killed"
    down = run_gpuzombie(env, "cluster", "down", timeout=300)
    assert down.returncode == 0, down.stderr
    assert _leftovers(root, f"gzcluster{instance}") == {"mounts": [], "processes": [], "bridge": "", "dir": False}
