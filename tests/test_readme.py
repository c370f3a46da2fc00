"""The README's claims a newcomer acts on: its set-up commands, its command table, its exit codes."""

from __future__ import annotations

import re

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
