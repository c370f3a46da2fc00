"""A --procfs that is no procfs (issue 18): every command says so in one line, exit 2, instead of
"No such file or directory" about a file the user never named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.proc.procfs import not_a_procfs

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
