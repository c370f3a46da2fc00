"""Stale and foreign GPU holders against a real containerd through its CRI socket, and a real gRPC
PodResources server on a unix socket (the kubelet's API; no kubelet runs here, so it is a stand-in
serving recorded assignments).

A *survivor*: a process holding a stand-in /dev/nvidia0 (a file on a private /dev, as the prestop
tests make it) that joined a real pod's cgroup from outside the pod's containers, so stopping and
removing the pod through the CRI leaves it running, as a process stuck in the driver outlives its
pod on a real node. Beside it, a pod the runtime runs whose container holds /dev/nvidia0 too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from containerd_fixture import needs_containerd
from cri_standin import standin_kubelet
from gpuzombie.cli.main import main
from gpuzombie.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.k8s.cri import BindMount, ContainerSpec, PodSpec, RunningPod
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, Containerd, _cgroup_roots
from gpuzombie.units import MIB
from pidns import wait_until

pytestmark = needs_containerd

HOLDER = ("/bin/sh", "-c", "exec 3</dev/nvidia0; exec sleep 300")
# Joins each cgroup named in argv, opens the private /dev's nvidia0 and becomes sleep with it open.
SURVIVOR = (
    "import os, sys\n"
    "for path in sys.argv[1:]:\n"
    "    with open(os.path.join(path, 'cgroup.procs'), 'w') as f:\n"
    "        f.write(str(os.getpid()))\n"
    "fd = os.open('/dev/nvidia0', os.O_RDONLY)\n"
    "os.set_inheritable(fd, True)\n"
    "os.execvp('sleep', ['sleep', '300'])\n"
)
PRIVATE_DEV = "mount -t tmpfs -o mode=755 stale-dev /dev && touch /dev/nvidia0"


def pod_cgroups(pod: PodSpec) -> list[str]:
    """The pod's own cgroup in every hierarchy that has it (the runtime made them with its sandbox)."""
    return [root + pod.cgroup_parent for root in _cgroup_roots() if os.path.isdir(root + pod.cgroup_parent)]


def holds_nvidia0(pid: int) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return False
    return comm == "sleep" and "/dev/nvidia0" in links


def start_survivor(pod: PodSpec) -> subprocess.Popen[bytes]:
    """A host process in ``pod``'s cgroup (no container's) holding /dev/nvidia0, ready when returned."""
    groups = pod_cgroups(pod)
    assert groups, f"no cgroup of pod {pod.uid}"
    script = f'{PRIVATE_DEV} && exec "$0" -c "$@"'
    proc = subprocess.Popen(["unshare", "--mount", "sh", "-c", script, sys.executable, SURVIVOR, *groups])
    wait_until(lambda: holds_nvidia0(proc.pid))
    return proc


@pytest.fixture
def pods(containerd: Containerd, kube_pods, tmp_path) -> Iterator[dict]:
    """A running pod whose container holds /dev/nvidia0, and the survivor of a second pod (still running)."""
    device = tmp_path / "nvidia0"
    device.write_text("")
    running = kube_pods(PodSpec(name="trainer-0", namespace="ml"))
    mount = (BindMount(str(device), "/dev/nvidia0", readonly=True),)
    holder_cid = running.start(ContainerSpec(name="cuda", image=BUSYBOX_IMAGE, command=HOLDER, mounts=mount))
    holder_pid = containerd.client.container_pid(holder_cid)
    wait_until(lambda: holds_nvidia0(holder_pid))
    doomed = containerd.start_pod(PodSpec(name="gone-0", namespace="ml"))
    survivor = None
    try:
        survivor = start_survivor(doomed.spec)
        yield {"running": running, "holder": holder_pid, "doomed": doomed, "survivor": survivor}
    finally:
        if survivor is not None:
            survivor.kill()
            survivor.wait()
        if doomed.sandbox_id in {s.id for s in containerd.client.list_pod_sandboxes()}:
            containerd.stop_pod(doomed)


def trace_json(socket: str, *extra: str, capsys) -> tuple[int, dict]:
    code = main(["trace", "--json", "--cri-socket", socket, "--pod-resources-socket", "/nonexistent", *extra])
    return code, json.loads(capsys.readouterr().out)


def rows_of(doc: dict, pid: int) -> list[dict]:
    return [r for r in doc["rows"] if r["pid"] == pid]


def test_a_holder_that_outlived_its_pod_is_stale_and_one_of_a_running_pod_is_not(containerd, pods, capsys):
    doomed: RunningPod = pods["doomed"]
    survivor, holder = pods["survivor"].pid, pods["holder"]
    _, doc = trace_json(containerd.socket, capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["pod_uid"] == doomed.spec.uid and row["dirty"] is None  # its pod still runs
    (held,) = rows_of(doc, holder)
    assert (held["pod"], held["dirty"]) == ("trainer-0", None)

    containerd.client.stop_pod_sandbox(doomed.sandbox_id)  # the kubelet's deletion: sandbox stopped
    code, doc = trace_json(containerd.socket, capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "stale" and "sandbox is stopped" in row["dirty_reason"], row
    assert "containerd at " in row["dirty_reason"]
    assert code == 1 and doc["summary"]["stale"] >= 1 and doc["checks"]["stale"] is True

    containerd.client.remove_pod_sandbox(doomed.sandbox_id)  # ... then removed
    _, doc = trace_json(containerd.socket, capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "stale" and f"pod {doomed.spec.uid} is gone from containerd" in row["dirty_reason"]
    (held,) = rows_of(doc, holder)
    assert held["dirty"] is None  # the running pod's holder, next to it

    main(["trace", "--cri-socket", containerd.socket, "--pod-resources-socket", "/nonexistent"])
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[-1] == "HOLDER"
    assert any(line.startswith(f"stale: pid {survivor} (sleep) holds GPU 0") for line in text.splitlines())
    assert "stale" in text.splitlines()[-1]

    # No runtime to ask: never stale, "unknown" with a warning, and not called healthy.
    code, doc = trace_json("/nonexistent.sock", capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "unknown" and doc["checks"]["stale"] is False and code == 1
    assert any("not judged stale or not" in w for w in doc["warnings"])


def test_exporter_names_the_stale_holder(containerd, pods, capsys):
    doomed: RunningPod = pods["doomed"]
    containerd.stop_pod(doomed)
    argv = ["exporter", "--once", "--cri-socket", containerd.socket, "--pod-resources-socket", "/nonexistent"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    mine = [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dirty_gpu_holders{") and f'pod_uid="{doomed.spec.uid}"' in line
    ]
    assert len(mine) == 1 and 'kind="stale"' in mine[0] and 'gpu="0"' in mine[0] and mine[0].endswith(" 1.0")
    assert 'gpuzombie_dirty_gpu_check{kind="stale"} 1.0' in text
    assert 'gpuzombie_dirty_gpu_check{kind="foreign"} 0.0' in text  # no PodResources socket
    assert not any('pod="trainer-0"' in line for line in text.splitlines() if line.startswith("gpuzombie_dirty"))


def test_podresources_over_grpc_tells_a_foreign_holder(containerd, kube_pods, tmp_path, capsys):
    """Two pods' processes on GPU 0 (NVML, replayed: no GPU here); the kubelet gave GPU 0 to trainer-0
    (as time-slicing's replica id ``GPU-…::0``): the other pod's holder is foreign."""
    device = tmp_path / "nvidia0"
    device.write_text("")
    mount = (BindMount(str(device), "/dev/nvidia0", readonly=True),)
    pids = {}
    for name in ("trainer-0", "intruder-0"):
        pod = kube_pods(PodSpec(name=name, namespace="ml"))
        cid = pod.start(ContainerSpec(name="cuda", image=BUSYBOX_IMAGE, command=HOLDER, mounts=mount))
        pids[name] = containerd.client.container_pid(cid)
        wait_until(lambda pid=pids[name]: holds_nvidia0(pid))
    processes = tuple(GpuProcess(pid, 1024 * MIB, "compute", "sleep") for pid in pids.values())
    gpus = GpuSnapshot(
        available=True,
        devices=(GpuDevice(0, "GPU-0000", "NVIDIA H200", 140 << 30, (615 + 2048) * MIB, 0, 615 * MIB, processes),),
    )
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(gpus)))
    kubelet = tmp_path / "kubelet.sock"
    with standin_kubelet(str(kubelet), {("ml", "trainer-0"): {"cuda": ("GPU-0000::0",)}}):
        argv = ["--cri-socket", containerd.socket, "--pod-resources-socket", str(kubelet), "--nvml-replay", str(replay)]
        assert main(["trace", "--json", *argv]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert main(["exporter", "--once", *argv]) == 0
        text = capsys.readouterr().out
    (intruder,) = rows_of(doc, pids["intruder-0"])
    assert (
        intruder["dirty"] == "foreign" and intruder["dirty_reason"] == "the kubelet assigned GPU-0000 to ml/trainer-0"
    )
    (trainer,) = rows_of(doc, pids["trainer-0"])
    assert trainer["dirty"] is None and doc["checks"]["foreign"] is True
    (series,) = [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dirty_gpu_memory_bytes{") and 'pod="intruder-0"' in line
    ]
    assert 'kind="foreign"' in series and 'UUID="GPU-0000"' in series and float(series.split()[-1]) == 1024 * MIB
