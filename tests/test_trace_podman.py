"""One real container: podman + runc running a busybox-static rootfs, so the parser meets a cgroup
path the kernel really made, and `gpuzombie trace` finds the zombie its non-init PID 1 leaves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuzombie.cli.main import main
from gpuzombie.k8s.cgroup import cgroup_version, parse_cgroup_lines
from gpuzombie.proc.procfs import Procfs
from markers import needs_root

PODMAN = shutil.which("podman")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
BUSYBOX = shutil.which("busybox")

pytestmark = [
    needs_root,
    pytest.mark.skipif(
        not (PODMAN and BUSYBOX and os.path.exists(RUNC)),
        reason="needs podman, runc and busybox-static (make setup installs them)",
    ),
]


def _podman(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PODMAN, "--runtime", RUNC, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def container(tmp_path):
    """A running container whose PID 1 is `sleep` and which holds one zombie (the seed's scenario 1)."""
    rootfs = tmp_path / "rootfs"
    for d in ("bin", "proc", "sys", "dev", "etc"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep"):
        os.symlink("busybox", rootfs / "bin" / applet)
    # sh starts a short-lived child, then execs sleep: the child exits and sleep never reaps it.
    started = _podman(
        "run",
        "-d",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--rootfs",
        str(rootfs),
        "/bin/sh",
        "-c",
        "sleep 0 & exec sleep 300",
    )
    if started.returncode != 0:
        pytest.skip(f"podman cannot start a container here: {started.stderr.strip()[-300:]}")
    cid = started.stdout.strip().splitlines()[-1]
    try:
        pid = int(_podman("inspect", "--format", "{{.State.Pid}}", cid).stdout.strip())
        yield cid, pid
    finally:
        _podman("rm", "-f", "-t", "0", cid)


def _zombie_child(pid: int) -> int | None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            try:
                if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    return int(child)
            except OSError:
                continue
        time.sleep(0.05)
    return None


def test_parser_maps_the_real_cgroup_to_the_podman_container(container):
    cid, pid = container
    proc = Procfs("/proc").read_process(pid, boot_time=0.0)
    ref = parse_cgroup_lines(proc.cgroup)
    assert ref is not None, proc.cgroup
    assert (ref.runtime, ref.container_id) == ("podman", cid)
    assert ref.cgroup_version == cgroup_version(proc.cgroup)
    assert ref.pod_uid is None and ref.qos is None
    assert proc.nspid[-1] == 1  # PID 1 of its own namespace


def test_trace_lists_the_containers_zombie(container, capsys):
    cid, pid = container
    zombie = _zombie_child(pid)
    assert zombie is not None, "the container's sleep PID 1 should hold an unreaped child"
    status = main(["trace", "--json", "--pod-resources-socket", "/nonexistent.sock"])
    doc = json.loads(capsys.readouterr().out)
    row = next(r for r in doc["rows"] if r["pid"] == zombie)
    assert (row["state"], row["verdict"], row["runtime"], row["container_id"]) == ("Z", "zombie", "podman", cid)
    assert row["nspid"] > 1 and row["nsmi"] is False  # a pid inside the container, not the host pid
    assert status == 1  # a zombie is a finding
