"""observe run inside real PID namespaces: PID 1 = sleep (no init), tini, dumb-init.

Each namespace gets the seed's situation: a parent that starts two children and exits without
wait(), then one child SIGKILLed. observe runs inside via nsenter, like ``kubectl exec``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from markers import needs_root, needs_tini
from pidns import PidNamespace, wait_until

pytestmark = needs_root

SPAWN = """
import os, subprocess, sys
for _ in range(2):
    subprocess.Popen(["sleep", "300"])
os._exit(0)  # the seed's parent.py: exit without wait()
"""

DUMB_INIT = shutil.which("dumb-init", path=os.path.dirname(sys.executable)) or shutil.which("dumb-init")


@pytest.fixture
def spawn(tmp_path):
    path = tmp_path / "spawn.py"
    path.write_text(SPAWN)
    return f"{sys.executable} {path}"


def sleep_children(ns: PidNamespace, pid: int) -> list:
    """The live ``sleep 300`` children the spawn script started (not PID 1's ``sleep infinity``)."""
    found = []
    for child in ns.children(pid):
        try:
            if child.cmdline() == ["sleep", "300"]:
                found.append(child)
        except Exception:  # gone, or a zombie without cmdline
            continue
    return found


def observe_json(ns: PidNamespace) -> tuple[int, dict]:
    result = ns.gpuzombie("observe", "--json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _is_zombie(proc: psutil.Process) -> bool:
    """False once the process is gone: an init may reap it between listing and asking."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone_or_zombie(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # reaped between the two questions
        return True


def kill_one_orphan(ns: PidNamespace, reaper_pid: int) -> None:
    """Wait for both orphans under ``reaper_pid`` and SIGKILL one of them (by host pid)."""
    orphans = wait_until(lambda: len(sleep_children(ns, reaper_pid)) == 2 and sleep_children(ns, reaper_pid))
    victim = orphans[0]
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: _gone_or_zombie(victim))


def test_sleep_as_pid1_keeps_zombies_and_orphans(spawn):
    with PidNamespace("sh", "-c", f"{spawn} & exec sleep infinity") as ns:
        wait_until(lambda: ns.children() and psutil_name(ns.pid1) == "sleep")
        kill_one_orphan(ns, ns.pid1)
        # A process entered from outside (parent pid 0 inside), like `kubectl exec`: not an orphan.
        entered = subprocess.Popen(ns.enter("sleep", "300"))
        wait_until(lambda: len(ns.children(entered.pid)) == 1)
        rc, report = observe_json(ns)

    assert report["schema"] == "gpuzombie.observe/1"
    assert report["view"]["in_root_pidns"] is False
    assert report["pid1"]["program"] == "sleep"
    assert report["pid1"]["kind"] == "non_forking"
    assert report["pid1"]["is_reaping_init"] is False
    # the parent (exited without wait) and the SIGKILLed child: both stay zombies under sleep
    parent, child = sorted(report["zombies"], key=lambda z: z["comm"])
    assert parent["comm"].startswith("python") and child["comm"] == "sleep"
    assert report["summary"]["zombies"] == 2
    assert all("never calls wait()" in z["reaped_by"] for z in report["zombies"])
    assert report["summary"]["orphans"] == 1
    (orphan,) = report["orphans"]
    assert orphan["comm"] == "sleep" and orphan["verdict"] == "orphan"
    assert "forks nothing after its exec" in orphan["evidence"][0]
    entered_local = [p for p in report["processes"] if p["ppid"] == 0 and p["pid"] != 1]
    assert len(entered_local) == 2  # `sleep 300` entered from outside, and observe itself
    assert report["summary"]["healthy"] is False and rc == 1
    assert report["gpu"]["available"] is False and report["gpu"]["reason"]


def psutil_name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def _init_namespace(spawn: str, *init: str) -> tuple[int, dict]:
    with PidNamespace(*init, "sh", "-c", f"{spawn}; exec sleep infinity") as ns:
        wait_until(lambda: psutil_name(ns.pid1) in ("tini", "dumb-init"))
        kill_one_orphan(ns, ns.pid1)
        # the init reaps the SIGKILLed orphan
        wait_until(lambda: not [c for c in ns.children() if _is_zombie(c)])
        return observe_json(ns)


def _assert_reaped_by_init(rc: int, report: dict, program: str) -> None:
    assert report["pid1"]["program"] == program
    assert report["pid1"]["kind"] == "init" and report["pid1"]["is_reaping_init"] is True
    assert report["summary"]["zombies"] == 0
    assert report["summary"]["orphans"] == 1
    (orphan,) = report["orphans"]
    assert orphan["comm"] == "sleep" and orphan["verdict"] == "orphan"
    assert "starts exactly one child (pid 2" in orphan["evidence"][0]
    # the init's own child (sh, now exec'd to `sleep infinity`) is not an orphan
    assert all(o["pid"] != 2 for o in report["orphans"])
    assert rc == 1  # a live orphan is still a finding


@needs_tini
def test_tini_reaps_orphaned_grandchildren(spawn):
    rc, report = _init_namespace(spawn, "tini", "--")
    _assert_reaped_by_init(rc, report, "tini")


@pytest.mark.skipif(DUMB_INIT is None, reason="dumb-init not installed")
def test_dumb_init_reaps_orphaned_grandchildren(spawn):
    rc, report = _init_namespace(spawn, DUMB_INIT)
    _assert_reaped_by_init(rc, report, "dumb-init")


def test_text_report_inside_namespace_has_eight_sections(spawn):
    with PidNamespace("sh", "-c", f"{spawn} & exec sleep infinity") as ns:
        wait_until(lambda: len(sleep_children(ns, ns.pid1)) == 2)
        result = ns.gpuzombie("observe")
    assert result.returncode == 1, result.stderr
    for n in range(1, 9):
        assert f"[{n}] " in result.stdout
    assert "NOT an init" in result.stdout
    assert "no GPU/NVML:" in result.stdout
    assert "(this observer)" in result.stdout
