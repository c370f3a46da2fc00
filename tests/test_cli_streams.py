"""What goes where: reports on stdout, warnings on stderr (text mode), and a bare ``gpuzombie`` is help.

A report piped into a file or a diff must not carry "warning:" lines that say nothing about the node;
JSON keeps its warnings inside the document (issue 18).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.cli.main import main


@pytest.fixture
def tree(tmp_path):
    """PID 1 and a /dev/nvidia0 holder whose fd directory cannot be listed: a warning in both commands."""
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="tini", cmdline=b"tini\0")
    make_fake_proc(root, 50, ppid=1, fds=("/dev/nvidia0",))
    shutil.rmtree(root / "50" / "fd")
    (root / "50" / "fd").write_text("")
    return root


COMMANDS = {
    "observe": ["observe"],
    "trace": ["trace", "--cri-socket", "/nonexistent.sock", "--pod-resources-socket", "/nonexistent"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_text_mode_warnings_go_to_stderr(command, tree, capsys):
    main([*COMMANDS[command], "--procfs", str(tree)])
    out, err = capsys.readouterr()
    assert "could not be fully read" not in out and "warning:" not in out, out
    assert f"gpuzombie {command}: warning: 1 processes could not be fully read: 50 (fd" in err, err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_json_keeps_its_warnings_in_the_document(command, tree, capsys):
    main([*COMMANDS[command], "--procfs", str(tree), "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    warnings = doc["view"]["warnings"] if command == "observe" else doc["warnings"]
    assert any("could not be fully read" in w for w in warnings) and "warning:" not in err, err


def test_bare_gpuzombie_prints_its_help_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "gpuzombie"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: gpuzombie [OPTIONS] COMMAND") and "Commands:" in done.stdout
    assert done.stderr == ""


def test_a_bare_group_prints_its_help_too(capsys):
    assert main(["lab"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Usage: gpuzombie lab") and err == ""
