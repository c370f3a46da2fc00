"""The lab's run directories (``lab.runtime.rundirs``): a run whose owner is gone is found by its
name and everything of it removed (a real process naming it, a real tmpfs mount in it); a live
owner's run is never touched."""

from __future__ import annotations

import os
import subprocess

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
        (cleaned,) = clean_dead_runs(tmp_path)
        assert cleaned.removed and cleaned.problems == () and not cleaned.owner_alive
        # -9: sh itself SIGKILLed; 137: its sleep SIGKILLed first and sh ran long enough to report it
        assert wait_until(lambda: held.poll() is not None, timeout=10) and held.returncode in (-9, 137)
        assert not dead.exists() and live.is_dir()
    finally:
        if held.poll() is None:
            held.kill()
        subprocess.run(["umount", "--lazy", str(dead / "volumes" / "scratch")], capture_output=True, check=False)
