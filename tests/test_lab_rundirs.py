"""The lab's run directories (``lab.runtime.rundirs``): a run whose owner is gone is found by its
name and everything of it removed (a real process naming it, a real tmpfs mount in it); a live
owner's run is never touched; `lab clean` returns once what it killed is gone, and names what is
not (issue 36: a zombie its parent has not reaped, a process a cgroup freezer holds)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

from gpuzombie.lab.runtime.rundirs import clean_dead_runs, new_run_dir, owner_of
from gpuzombie.proc.pidfd import read_start_and_state
from markers import needs_root
from pidns import wait_until

pytestmark = [needs_root]


def dead_owner_name() -> str:
    """``<pid>.<start ticks>`` of a process that has exited (and been reaped)."""
    gone = subprocess.Popen(["sleep", "0"])
    state = read_start_and_state("/proc", gone.pid)
    gone.wait()
    return f"{gone.pid}.{state[0] if state else 1}"


def test_a_dead_runs_process_mount_and_directory_are_removed_and_a_live_run_kept(tmp_path):
    live = new_run_dir(tmp_path)
    owner = owner_of(live)
    assert owner is not None and owner.pid == os.getpid()
    dead = tmp_path / f"{dead_owner_name()}.0badc0de"
    (dead / "volumes" / "scratch").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "labpod-test", str(dead / "volumes" / "scratch")], check=True)
    # a process that names the run in its command line, as its containerd and shims do
    held = subprocess.Popen(["sh", "-c", "sleep 600", str(dead / "config.toml")], start_new_session=True)
    try:
        (found,) = clean_dead_runs(tmp_path, dry_run=True)
        assert found.path == str(dead) and held.pid in found.processes and len(found.mounts) == 1  # sh and its sleep
        assert dead.exists() and held.poll() is None  # a dry run removes nothing
        reaper = threading.Thread(target=held.wait, daemon=True)  # as its parent, the test reaps it
        reaper.start()
        (cleaned,) = clean_dead_runs(tmp_path)
        assert cleaned.removed and cleaned.problems == () and not cleaned.owner_alive  # it was reaped
        # -9: sh itself SIGKILLed; 137: its sleep SIGKILLed first and sh ran long enough to report it
        reaper.join(timeout=60)
        assert held.returncode in (-9, 137)
        assert not dead.exists() and live.is_dir()
    finally:
        if held.poll() is None:
            held.kill()
        subprocess.run(["umount", "--lazy", str(dead / "volumes" / "scratch")], capture_output=True, check=False)


REAPS_LATE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", os.environ["RUN"] + "/config.toml"])
    print(child.pid, flush=True)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it died: a zombie until waited for
    time.sleep(float(sys.argv[1]))
    child.wait()
    time.sleep(600)
    """
)


@contextlib.contextmanager
def child_reaped_late(run: pathlib.Path, seconds: float) -> Iterator[tuple[int, int]]:
    """(pid, pidfd) of a process naming ``run`` (as a shim does) whose parent, outside the run,
    waits for it only ``seconds`` after it died: as init reaps the pause and the container once
    their shim is killed too (process_api, PID 1 of the development VM, reaps every 2 s)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", REAPS_LATE, str(seconds)],
        env={**os.environ, "RUN": str(run)},  # not in its own command line: it is no process of the run
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        pidfd = os.pidfd_open(pid)
        try:
            yield pid, pidfd
        finally:
            os.close(pidfd)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def in_the_process_table(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    return True  # alive, or a zombie


@pytest.mark.slow
def test_lab_clean_returns_once_what_it_killed_is_gone(tmp_path):
    """Before (e95cc19): it waited until each pidfd polled readable, which a zombie does, and
    returned in 0.23-0.27 s with the killed process still in the process table (1 of 1 here; a
    daemonized shim with three children: 4 of 4, init reaping them 2 s later), exit 0. Now it waits
    until each is reaped (3.3 s here, 10 s at most), exit 0, nothing left."""
    dead = tmp_path / f"{dead_owner_name()}.0badc0de"
    dead.mkdir()
    with child_reaped_late(dead, 3.0) as (pid, pidfd):
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "lab", "clean", "--state-dir", str(tmp_path), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        there = in_the_process_table(pidfd)
    assert not there, "lab clean returned while a process it killed was still in the process table"
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert pid in run["processes"] and run["removed"] and run["not_ended"] == [] and run["problems"] == []


def freezer_v1() -> pathlib.Path | None:
    root = pathlib.Path("/sys/fs/cgroup/freezer")
    return root if (root / "cgroup.procs").exists() else None


def test_lab_clean_names_what_it_could_not_end(tmp_path):
    """Before: a zombie its parent never reaps and a process frozen by a cgroup v1 freezer (SIGKILL
    waits for the thaw; ``ctr task pause`` freezes so) were waited for, then the run was reported
    removed, no problem, exit 0. Now each is named with why, in ``problems`` and ``not_ended`` (the
    wait here 1 s; `lab clean` waits 10 s)."""
    dead = tmp_path / f"{dead_owner_name()}.0badc0de"
    dead.mkdir()
    freezer = freezer_v1()
    frozen: subprocess.Popen[bytes] | None = None
    cgroup = freezer / f"gpuzombie-test-{os.getpid()}" if freezer else None
    with child_reaped_late(dead, 600.0) as (zombie, _pidfd):
        try:
            if cgroup is not None:
                cgroup.mkdir()
                frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(dead / "shim")])
                (cgroup / "cgroup.procs").write_text(f"{frozen.pid}\n")
                (cgroup / "freezer.state").write_text("FROZEN\n")
                assert wait_until(lambda: (cgroup / "freezer.state").read_text().strip() == "FROZEN")
            (cleaned,) = clean_dead_runs(tmp_path, kill_wait_s=1.0)
        finally:
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    (cgroup / "freezer.state").write_text("THAWED\n")
                if frozen is not None:
                    frozen.kill()
                    frozen.wait()
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
    assert re.fullmatch(
        rf"pid {zombie} \(\S+\) killed, but not reaped 1 s later: its parent pid \d+ \(\S+\) has not waited for it",
        cleaned.problems[0],
    ), cleaned.problems
    expected = [zombie]
    if frozen is not None:
        assert re.fullmatch(
            rf"pid {frozen.pid} \(\S+\) still alive 1 s after SIGKILL \(state D, frozen by the cgroup freezer "
            rf"{cgroup} \(thaw it: SIGKILL waits for that\)\)",
            cleaned.problems[1],
        ), cleaned.problems
        expected.append(frozen.pid)
    assert sorted(cleaned.not_ended) == sorted(expected) and len(cleaned.problems) == len(expected)
