"""A --procfs that is no procfs (issue 18): every command says so in one line, exit 2, instead of
"No such file or directory" about a file the user never named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root
from gpuzombie.proc.pidns import ROOT_PIDNS_INODE
from gpuzombie.proc.procfs import not_a_procfs
from markers import needs_root

SRC = str(Path(__file__).resolve().parents[1] / "src")
COMMANDS = {
    "observe": ["-m", "gpuzombie", "observe"],
    "trace": ["-m", "gpuzombie", "trace"],
    "exporter": ["-m", "gpuzombie", "exporter", "--once"],
    "prestop": ["-m", "gpuzombie", "prestop", "--no-nvml"],
    "prestop-hook": ["-m", "gpuzombie.prestop", "--no-nvml"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_that_is_no_procfs_is_named_as_such(tmp_path, command):
    (tmp_path / "notes.txt").write_text("not a process\n")
    done = subprocess.run(
        [sys.executable, *COMMANDS[command], "--procfs", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=60,
    )
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        f"gpuzombie: error: {tmp_path} is not a procfs (no stat file, no process directories): "
        "give the root of one, e.g. /proc or /host/proc"
    ]


def test_what_makes_a_procfs_tree(tmp_path):
    assert not_a_procfs("/proc") is None
    assert not_a_procfs(str(tmp_path)).startswith(f"{tmp_path} is not a procfs")
    # Missing roots, files and broken trees are left to the error that names them.
    assert not_a_procfs(str(tmp_path / "absent")) is None
    (tmp_path / "file").write_text("")
    assert not_a_procfs(str(tmp_path / "file")) is None
    make_fake_proc(tmp_path, 1, ppid=0)
    assert not_a_procfs(str(tmp_path)) is None  # a pid directory without /proc/stat: a broken tree
    make_fake_root(tmp_path)
    assert not_a_procfs(str(tmp_path)) is None


def _start_ticks(pid: int) -> int:
    """The real process's start time in clock ticks (stat field 22), as a forged tree copies it."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _tree_naming_us_and(root: Path, sleeper: int, *, pidns: int) -> None:
    """A plain directory forged as a procfs: ``self`` names this very process (the pid the acting
    command runs as, in-process here), and a real sleeper is listed as a stale pod's GPU holder with
    its true start time, so every identity check the acting commands make on the tree passes."""
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="init", pidns=pidns)
    make_fake_proc(root, os.getpid(), ppid=1, comm="gpuzombie", pidns=pidns)
    make_fake_proc(
        root, sleeper, ppid=1, comm="sleep", fds=("/dev/nvidia0",), starttime=_start_ticks(sleeper), pidns=pidns
    )
    (root / str(sleeper) / "cgroup").write_text("0::/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-00000000dead\n")
    os.symlink(str(os.getpid()), root / "self")


ACTING = {
    # reap runs in the host's PID namespace; the stand-in runtime lists no pod, so the sleeper's is stale
    "reap": (ROOT_PIDNS_INODE, ["reap", "--yes", "--no-nvml", "--timeout", "1", "--kill-wait", "1"]),
    # prestop runs inside a pod's PID namespace, where the sleeper is a GPU holder and an orphan
    "prestop": (TREE_PIDNS, ["prestop", "--no-nvml", "--no-pid1-log", "--timeout", "1", "--kill-wait", "1"]),
}


@needs_root
@pytest.mark.parametrize("command", ACTING)
def test_acting_commands_refuse_a_plain_directory_forged_as_procfs(tmp_path, command, capsys):
    """Issue 29 item 3: on 241ae16 the forged tree passed every check and the sleeper got SIGTERM
    (reap: exit 0, 'exited_after_sigterm'; prestop: exit 0). Now: exit 2, one line, nothing signalled."""
    pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")
    from cri_standin import Recorded, standin_runtime
    from gpuzombie.cli.main import main

    pidns, args = ACTING[command]
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        tree = tmp_path / "proc"
        tree.mkdir()
        _tree_naming_us_and(tree, sleeper.pid, pidns=pidns)
        socket = str(tmp_path / "cri.sock")
        runtime = ["--cri-socket", socket] if command == "reap" else []
        running = ("a" * 64, "other", "ml", "0a1b2c3d-0000-4000-8000-00000000beef")  # its pod is not the sleeper's
        with standin_runtime(socket, Recorded(sandboxes=(running,))):
            code = main([*args, *runtime, "--procfs", str(tree)])
        out, err = capsys.readouterr()
        assert sleeper.poll() is None, f"{command} exit {code} signalled the sleeper ({sleeper.returncode}): {out}"
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"{tree} is not a mounted proc filesystem (statfs type 0x" in err
    finally:
        sleeper.kill()
        sleeper.wait()


def test_only_a_mounted_proc_is_one():
    from gpuzombie.proc.procfs import not_mounted_proc

    assert not_mounted_proc("/proc") is None
    assert not_mounted_proc("/") is not None and "is not a mounted proc filesystem" in not_mounted_proc("/")
    assert not_mounted_proc("/absent/dir").startswith("cannot tell whether /absent/dir is a mounted procfs")
