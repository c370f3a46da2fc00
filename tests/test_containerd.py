"""The private containerd library: images built here, pods made as the kubelet makes them, and a
tear-down that leaves nothing behind, also after an error or a runtime killed under it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


from containerd_fixture import needs_containerd
from gpuzombie.k8s.cgroup import parse_cgroup_lines
from gpuzombie.k8s.cri import ContainerSpec, SandboxSpec, sandbox_config
from gpuzombie.k8s.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID
from gpuzombie.lab.runtime import containerd as ctd_lib
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, ImageSpec, private_containerd, write_image_archive
from gpuzombie.lab.runtime.rundirs import cgroup_roots
from gpuzombie.proc.procfs import Procfs
from pidns import wait_until

SLEEP_WITH_ZOMBIE = ContainerSpec(
    name="worker", image=BUSYBOX_IMAGE, command=("/bin/sh", "-c", "sleep 0 & exec sleep 300")
)


# --- pure parts ------------------------------------------------------------------------------------


def test_image_archive_is_a_docker_archive(tmp_path):
    source = tmp_path / "tool"
    source.write_bytes(b"#!/bin/sh\n")
    source.chmod(0o755)
    spec = ImageSpec(name="localhost/x:1", files={"bin/tool": str(source)}, symlinks={"bin/t": "tool"}, cmd=("/bin/t",))
    write_image_archive(spec, tmp_path / "img.tar")
    with tarfile.open(tmp_path / "img.tar") as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        (entry,) = manifest
        config = json.load(archive.extractfile(entry["Config"]))  # type: ignore[arg-type]
        with tarfile.open(fileobj=archive.extractfile(entry["Layers"][0])) as layer:
            members = {m.name: m for m in layer.getmembers()}
    assert entry["RepoTags"] == ["localhost/x:1"]
    assert config["config"]["Cmd"] == ["/bin/t"] and config["rootfs"]["diff_ids"][0].startswith("sha256:")
    assert members["bin/tool"].mode == 0o755 and members["bin/t"].linkname == "tool"
    assert members["tmp"].isdir() and members["proc"].isdir()


def test_the_same_spec_gives_the_same_archive(tmp_path):
    spec = ImageSpec(name="localhost/x:1", files={}, entrypoint=("/x",))
    write_image_archive(spec, tmp_path / "a.tar")
    write_image_archive(spec, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_config_keeps_everything_in_the_work_dir():
    text = ctd_lib.config_toml(Path("/tmp/w"))
    assert 'root = "/tmp/w/root"' in text and 'address = "/tmp/w/containerd.sock"' in text
    assert "restrict_oom_score_adj = true" in text and 'conf_dir = "/tmp/w/cni/conf"' in text


@pytest.mark.parametrize(
    ("qos", "parent"),
    [
        ("besteffort", "/kubepods/besteffort/podU"),
        ("burstable", "/kubepods/burstable/podU"),
        ("guaranteed", "/kubepods/podU"),
    ],
)
def test_cgroup_parent_is_the_kubelets(qos, parent):
    assert SandboxSpec(name="p", uid="U", qos=qos).cgroup_parent == parent


def test_unknown_qos_is_refused():
    with pytest.raises(ValueError, match="qos"):
        SandboxSpec(name="p", qos="platinum")


def test_sandbox_config_carries_the_kubelet_labels():
    config = sandbox_config(SandboxSpec(name="p", namespace="ns", uid="U", labels={"app": "a"}), log_root="/logs")
    assert dict(config.labels) == {"app": "a", POD_NAME: "p", POD_NAMESPACE: "ns", POD_UID: "U"}
    assert config.log_directory == "/logs/ns_p_U" and config.linux.cgroup_parent == "/kubepods/besteffort/podU"


# --- on a real containerd ------------------------------------------------------------------------


def _leftovers(workdir: Path, socket: str, cgroup: str) -> list[str]:
    """What a private containerd could leave: its dir, its processes, its pod cgroup."""
    left = [str(workdir)] if workdir.exists() else []
    table = Procfs().snapshot(now=time.time(), with_cgroup=False)
    left += [p.command for p in table if any(socket in arg for arg in p.cmdline)]
    left += [f"cgroup {cgroup}" for root in cgroup_roots() if os.path.isdir(root + cgroup)]
    return left


def _gone_or_zombie(pid: int) -> bool:
    """Killed: gone, or exited and waiting for init to reap it."""
    return all(p.is_zombie for p in Procfs().snapshot([pid], now=time.time(), with_cgroup=False))


@needs_containerd
class TestOnContainerd:
    def test_container_sits_where_the_kubelet_puts_it(self, containerd, kube_pods):
        spec = SandboxSpec(name="trainer-0", namespace="ml", qos="burstable")
        pod = kube_pods(spec)
        cid = pod.start(SLEEP_WITH_ZOMBIE)
        pid = containerd.client.container_pid(cid)
        ref = parse_cgroup_lines(Path(f"/proc/{pid}/cgroup").read_text().splitlines())
        assert ref is not None
        assert (ref.container_id, ref.pod_uid, ref.qos, ref.runtime) == (cid, spec.uid, "burstable", "containerd")
        (listed,) = [c for c in containerd.client.list_containers() if c.id == cid]
        assert listed.labels[CONTAINER_NAME] == "worker" and listed.labels[POD_NAME] == "trainer-0"
        assert listed.labels[POD_NAMESPACE] == "ml" and listed.labels[POD_UID] == spec.uid

    def test_exec_sees_the_containers_own_pid_namespace(self, containerd, kube_pods):
        pod = kube_pods(SandboxSpec(name="p"))
        cid = pod.start(SLEEP_WITH_ZOMBIE)
        wait_until(lambda: b"Z" in containerd.client.exec_sync(cid, ["ps", "-o", "pid,stat,args"]).stdout)
        lines = containerd.client.exec_sync(cid, ["ps", "-o", "pid,stat,args"]).stdout.decode().splitlines()
        assert lines[1].split()[0] == "1" and lines[1].endswith("sleep 300")

    def test_pause_is_a_reaping_catatonit(self, containerd, kube_pods):
        pod = kube_pods(SandboxSpec(name="p"))
        (sandbox,) = [s for s in containerd.client.list_pod_sandboxes() if s.id == pod.sandbox_id]
        assert sandbox.labels[POD_NAME] == "p"

        def pauses() -> list:
            table = Procfs().snapshot(now=time.time(), with_cgroup=True)
            return [p for p in table if p.cmdline[:2] == ("/catatonit", "-P") and pod.spec.uid in "".join(p.cgroup)]

        # runc's start returns before its init has exec'd the pause (cmdline still `runc init`)
        assert len(wait_until(pauses)) == 1


@needs_containerd
@pytest.mark.parametrize("fault", ["error", "runtime-killed"])
def test_teardown_leaves_nothing(fault):
    spec = SandboxSpec(name="doomed")
    with pytest.raises(RuntimeError, match="test failed"), private_containerd() as ctd:
        workdir, socket = ctd.workdir, ctd.socket
        pod = ctd.start_pod(spec)  # never stopped: the tear-down must find it
        cid = pod.start(SLEEP_WITH_ZOMBIE)
        pid = ctd.client.container_pid(cid)
        if fault == "runtime-killed":
            os.kill(ctd.pid, signal.SIGKILL)
            ctd.process.wait()
        raise RuntimeError("test failed")
    assert _leftovers(workdir, socket, spec.cgroup_parent) == []
    wait_until(lambda: _gone_or_zombie(pid))


@needs_containerd
def test_pods_of_the_raw_client_leave_no_cgroup():
    """A pod made and removed through ``ctd.client`` directly: its cgroup is still removed at the end."""
    spec = SandboxSpec(name="raw", qos="burstable")
    with private_containerd() as ctd:
        sandbox = ctd.client.run_pod_sandbox(spec)
        assert any(os.path.isdir(root + spec.cgroup_parent) for root in cgroup_roots())
        ctd.client.stop_pod_sandbox(sandbox)
        ctd.client.remove_pod_sandbox(sandbox)
    assert not any(os.path.isdir(root + spec.cgroup_parent) for root in cgroup_roots())


FAILING_TEST = """
import json, os
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE
from gpuzombie.k8s.cri import ContainerSpec, SandboxSpec

def test_fails_with_a_running_pod(containerd, kube_pods):
    pod = kube_pods(SandboxSpec(name="fails"))
    cid = pod.start(ContainerSpec(name="c", image=BUSYBOX_IMAGE, command=("sleep", "300")))
    seen = {"workdir": str(containerd.workdir), "socket": containerd.socket, "cgroup": pod.spec.cgroup_parent,
            "pid": containerd.client.container_pid(cid)}
    with open(os.environ["SEEN"], "w") as f:
        json.dump(seen, f)
    assert False, "a failing test"
"""


@needs_containerd
@pytest.mark.slow
def test_a_failing_test_leaves_nothing(tmp_path):
    """The fixtures as a test uses them: the test fails with a pod running; nothing is left after."""
    (tmp_path / "test_fails.py").write_text(FAILING_TEST)
    seen = tmp_path / "seen.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "containerd_fixture", "-p", "no:cacheprovider", "test_fails.py"],
        cwd=tmp_path,
        env={**os.environ, "SEEN": str(seen), "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and "a failing test" in done.stdout, done.stdout + done.stderr
    info = json.loads(seen.read_text())
    assert _leftovers(Path(info["workdir"]), info["socket"], info["cgroup"]) == []
    wait_until(lambda: _gone_or_zombie(info["pid"]))
