"""The README's claims a newcomer acts on: its set-up commands, its command table, its exit codes."""

from __future__ import annotations

import re
import tomllib

from docs import REPO, doc, section
from gpuzombie.cli.main import COMMAND_MODULES
from gpuzombie.exitcodes import ExitStatus


def test_the_two_setup_commands_are_make_targets():
    commands = re.findall(r"^make (\w+)", section(doc("README"), "## Set-up"), re.MULTILINE)
    targets = set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))
    assert commands == ["lab", "test"] and set(commands) <= targets


def test_the_command_table_names_every_subcommand():
    table = section(doc("README"), "## Commands")
    named = set(re.findall(r"^\| `gpuzombie (\w+)", table, re.MULTILINE))
    assert named == set(COMMAND_MODULES)


def test_the_exit_code_table_is_the_enum():
    table = section(doc("README"), "## Exit codes")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == {int(status) for status in ExitStatus}


def test_links_to_moved_reference_pages_resolve():
    """docs/ pages this branch moved out of the README exist (others are written alongside)."""
    moved = ("observe", "trace", "prestop", "graceful", "lab", "nccl", "exporter", "development")
    linked = set(re.findall(r"\(docs/(\w[\w-]*)\.md\)", doc("README")))
    assert set(moved) <= linked
    for name in moved:
        assert (REPO / "docs" / f"{name}.md").is_file(), name


def _shell_lines(text: str) -> list[str]:
    """The command lines of the ```sh blocks, comments dropped."""
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_commands_run_as_written_after_setup():
    """After `make lab`/`make test` the CLI is the project venv's, not on PATH; no sudo on a minimal
    Debian (the commands run as root); Debian's pip refuses the system Python (PEP 668)."""
    venv = re.search(r"^VENV \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)[1]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert f"{venv}/bin/gpuzombie" in doc("README") and "gpuzombie" in scripts
    lines = _shell_lines(doc("README"))
    assert lines, "the README has shell blocks"
    for line in lines:
        assert not line.startswith(("sudo ", "gpuzombie ")), line
        for pip in re.findall(r"(\S*pip) install", line):
            assert pip.endswith("/bin/pip"), f"pip of a venv: {line}"
    commands = [line for line in lines if line.startswith(f"{venv}/bin/gpuzombie ")]
    named = {line.split()[1] for line in commands}
    assert named <= set(COMMAND_MODULES) and commands, commands
