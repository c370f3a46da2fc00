"""Pods as PID namespaces: each init's answer to the kubelet's SIGTERM, and nothing left after."""

from __future__ import annotations

import json
import os
import sys

import pytest

from gpuzombie.cli.main import main
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.runtime.pidns import Pod, absolute_pythonpath, children_of, init_argv, pids_in_pidns
from markers import needs_root, needs_tini
from pidns import wait_until

pytestmark = [needs_root, needs_tini]


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def settled(pod: Pod) -> None:
    """Wait until the container's `sleep` runs (an init forwards nothing before its child is set up)."""
    wait_until(lambda: comm(pod.pid1) == "sleep" or any(comm(c) == "sleep" for c in children_of(pod.pid1)))


def make_pod(init: str, prestop: list[str] | None = None) -> Pod:
    return Pod(f"t-{init}", init, ["true"], log=open(os.devnull, "w"), events=EventLog(), prestop=prestop)


@pytest.mark.parametrize("init,waits", [("sleep", True), ("tini", False), ("tini-g", False), ("dumb-init", False)])
def test_delete_follows_the_kubelet(init, waits):
    pod = make_pod(init)
    pod.start()
    try:
        settled(pod)
        deletion = pod.delete(grace=1.0)
    finally:
        pod.kill()
    took = deletion.exited_at - deletion.requested_at
    if waits:  # sleep as PID 1: the kernel drops SIGTERM, only SIGKILL at the grace's end works
        assert deletion.sigkill_at is not None and 1.0 <= took < 2.5
    else:  # an init forwards SIGTERM, its child dies, it exits, the namespace ends
        assert deletion.sigkill_at is None and took < 1.0
    assert deletion.leftovers == () and pids_in_pidns(pod.pidns) == []


def test_prestop_runs_inside_the_pod_before_sigterm():
    pod = make_pod("tini", [sys.executable, "-c", "import os; print(os.getpid(), open('/proc/1/comm').read())"])
    pod.start()
    try:
        deletion = pod.delete(grace=5.0)
    finally:
        pod.kill()
    pid, comm = deletion.prestop_stdout.split()
    assert deletion.prestop_rc == 0 and comm == "tini" and int(pid) < 100  # a pid of the pod
    names = [e.name for e in pod.events.events]
    assert names.index("prestop-end") < names.index("sigterm")


def test_unknown_init_is_refused():
    with pytest.raises(Exception, match="unknown init"):
        init_argv("systemd", "true")


def uid_1000_can_run_python() -> bool:
    """Probe exactly as parent.py starts a worker (``Popen(user=1000)``, the pod's environment).

    Not ``setpriv --reuid``: setpriv keeps its capabilities until the exec, so it runs a venv python
    whose symlink points into /root, which the lab's worker then cannot (the flake this replaces)."""
    import subprocess

    probe = [sys.executable, "-c", "import gpuzombie.workloads.worker"]
    try:
        done = subprocess.run(probe, user=1000, env=absolute_pythonpath(os.environ), capture_output=True, check=False)
    except OSError:  # PermissionError: uid 1000 cannot execute this Python
        return False
    return done.returncode == 0


def test_variant_dumb_init_and_uid_1000(tmp_path):
    """A variant run: dumb-init as PID 1, and the seed's non-root workers (uid 1000) where this
    Python is readable by uid 1000 (not under /root)."""
    uid = ["--uid", "1000"] if uid_1000_can_run_python() else []
    status = main(
        [
            "lab",
            "run",
            "--scenario",
            "s2-tini",
            "--init",
            "dumb-init",
            *uid,
            "--grace",
            "1",
            "--size-mib",
            "16",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    data = json.loads((tmp_path / "results.json").read_text())
    key = "s2-tini-uid1000-dumb-init" if uid else "s2-tini-dumb-init"
    entry = data["scenarios"][key]
    assert entry["init"] == "dumb-init" and entry["metrics"]["release_latency_s"] < 1.0
    assert obs_zombies(entry) == 0 and key in (tmp_path / "comparison.md").read_text()


def obs_zombies(entry: dict) -> int:
    return next(o["zombies"] for o in entry["observations"] if o["point"] == "after-kill")


def test_variant_main_worker_under_tini_waits_the_whole_grace(tmp_path):
    """The seed's S2 expectation holds when the workload itself is the container's main process:
    tini forwards SIGTERM to it, it ignores it, and only SIGKILL at the grace's end frees it."""
    status = main(
        [
            "lab",
            "run",
            "--scenario",
            "s2-tini",
            "--main",
            "worker",
            "--grace",
            "1",
            "--size-mib",
            "16",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    entry = json.loads((tmp_path / "results.json").read_text())["scenarios"]["s2-tini-main-worker"]
    m = entry["metrics"]
    assert m["waited_whole_grace"] and 1.0 <= m["release_latency_s"] < 2.0
    assert obs_zombies(entry) == 0 and "--main worker" in entry["provenance"]["command"]
