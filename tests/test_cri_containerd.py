"""trace and the exporter against a real containerd through its CRI socket: pods made as the kubelet
makes them, and in them a zombie under a ``sleep`` PID 1, an orphan, and a holder of a stand-in
/dev/nvidia0; each shown with its pod name, namespace and container name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


from containerd_fixture import needs_containerd
from gpuzombie.cli.main import main
from gpuzombie.k8s.cri import BindMount, ContainerSpec, RunningPod, SandboxSpec
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, Containerd
from pidns import wait_until

pytestmark = needs_containerd

# sh forks a short job, then becomes sleep: the job exits and sleep never reaps it.
ZOMBIE = ("/bin/sh", "-c", "sleep 0 & exec sleep 300")
# A job in its own session starts sleep and exits: sleep is re-parented to PID 1, its session gone.
ORPHAN = ("/bin/sh", "-c", "setsid sh -c 'sleep 301 &'; exec sleep 300")
# The container's /dev/nvidia0 is a stand-in file bind-mounted from the host; sleep keeps it open.
HOLDER = ("/bin/sh", "-c", "exec 3</dev/nvidia0; exec sleep 300")


@pytest.fixture
def node(containerd: Containerd, kube_pods, tmp_path):
    """Three kubelet-style pods; the ids of their containers and when each is ready."""
    device = tmp_path / "nvidia0"
    device.write_text("")

    def start(pod: str, namespace: str, container: str, command: tuple[str, ...], mounts=()) -> tuple[str, RunningPod]:
        running = kube_pods(SandboxSpec(name=pod, namespace=namespace))
        spec = ContainerSpec(name=container, image=BUSYBOX_IMAGE, command=command, mounts=mounts)
        return running.start(spec), running

    zombie, _ = start("trainer-0", "ml", "worker", ZOMBIE)
    orphan, _ = start("launcher-0", "batch", "launcher", ORPHAN)
    holder, _ = start("holder-0", "gpu", "cuda", HOLDER, (BindMount(str(device), "/dev/nvidia0", readonly=True),))

    def ps(cid: str) -> str:
        return containerd.client.exec_sync(cid, ["ps", "-o", "pid,stat,args"]).stdout.decode()

    wait_until(lambda: re.search(r"\sZ\s", ps(zombie)))
    wait_until(lambda: "sleep 301" in ps(orphan) and "setsid" not in ps(orphan))
    return {"zombie": zombie, "orphan": orphan, "holder": holder}


def test_trace_names_each_finding(containerd, node, capsys):
    argv = ["trace", "--json", "--cri-socket", containerd.socket, "--pod-resources-socket", "/nonexistent"]
    assert main(argv) == 1  # a zombie: findings
    doc = json.loads(capsys.readouterr().out)
    assert doc["sources"]["cri_socket"] == containerd.socket
    rows = {}
    for row in doc["rows"]:
        if row["container_id"] in node.values():
            rows.setdefault(row["container_id"], []).append(row)
    (zombie,) = rows[node["zombie"]]
    assert (zombie["state"], zombie["verdict"]) == ("Z", "zombie")
    assert (zombie["pod"], zombie["namespace"], zombie["container"]) == ("trainer-0", "ml", "worker")
    assert (zombie["runtime"], zombie["qos"], zombie["cgroup_driver"]) == ("containerd", "besteffort", "cgroupfs")
    (holder,) = rows[node["holder"]]
    assert (holder["verdict"], holder["devices"]) == ("fd-only", ["/dev/nvidia0"])
    assert (holder["pod"], holder["namespace"], holder["container"]) == ("holder-0", "gpu", "cuda")
    assert node["orphan"] not in rows  # trace shows GPU processes, device holders and zombies only
    _no_runtime_trouble(" ".join(doc["warnings"]), node)


def _no_runtime_trouble(warnings: str, node: dict[str, str]) -> None:
    """The runtime answered, and knew our containers (other runtimes' containers on this machine,
    say another test's private containerd, may be named unknown)."""
    assert "pods and containers shown by id" not in warnings
    assert not [cid for cid in node.values() if cid[:13] in warnings]


def _samples(text: str, metric: str, **labels: str) -> list[str]:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return [line for line in text.splitlines() if line.startswith(metric + "{") and all(w in line for w in want)]


def test_exporter_names_each_finding(containerd, node, capsys):
    assert (
        main(["exporter", "--once", "--cri-socket", containerd.socket, "--pod-resources-socket", "/nonexistent"]) == 0
    )
    out = capsys.readouterr()
    text = out.out
    (zombies,) = _samples(text, "gpuzombie_zombies", namespace="ml", pod="trainer-0", container="worker")
    assert zombies.endswith(" 1.0")
    (by_parent,) = _samples(text, "gpuzombie_zombies_by_parent", pod="trainer-0", container="worker", parent="sleep")
    assert 'parent_is_pid1="true"' in by_parent and by_parent.endswith(" 1.0")
    (orphans,) = _samples(text, "gpuzombie_orphans", namespace="batch", pod="launcher-0", container="launcher")
    assert 'verdict="orphan"' in orphans and orphans.endswith(" 1.0")
    (holders,) = _samples(text, "gpuzombie_fd_only_holders", namespace="gpu", pod="holder-0", container="cuda")
    assert holders.endswith(" 1.0")
    for pod in ("trainer-0", "launcher-0", "holder-0"):  # each container's PID 1, and no bare ids
        (pid1,) = _samples(text, "gpuzombie_pid1_info", pod=pod, program="sleep")
        assert 'container=""' not in pid1
    _no_runtime_trouble(out.err, node)


def test_names_through_a_read_only_mount_of_the_socket(containerd, node, tmp_path):
    """What the DaemonSet does: the socket bind-mounted read-only (connect() is no write)."""
    target = tmp_path / "ro" / "containerd.sock"
    target.parent.mkdir()
    target.write_text("")
    trace = f"{sys.executable} -m gpuzombie trace --json --cri-socket {target} --pod-resources-socket /nonexistent"
    script = f"mount --bind {containerd.socket} {target} && mount -o remount,bind,ro {target} && exec {trace}"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr  # the zombie
    rows = [r for r in json.loads(done.stdout)["rows"] if r["container_id"] == node["zombie"]]
    assert [(r["pod"], r["namespace"], r["container"]) for r in rows] == [("trainer-0", "ml", "worker")]
