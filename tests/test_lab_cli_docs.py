"""The lab's one CLI against its docs: every `gpuzombie lab run ...` line of docs/nccl.md and
docs/lab.md parses as written (placeholders filled in), and every option it names is in `--help`."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from docs import doc
from gpuzombie.cli.lab import run_command

PLACEHOLDERS = {"N": "2", "S": "5", "T": "10", "M": "64", "DIR": "/tmp/out", "PATH": "/run/x.sock", "U": "1000"}
"""A sample value for each placeholder the docs write after an option."""


def documented_runs(page: str) -> list[str]:
    """The `gpuzombie lab run ...` command lines of a page (code spans and fenced lines)."""
    text = doc(page)
    spans = re.findall(r"`(gpuzombie lab run[^`]*)`", text, flags=re.DOTALL)
    fenced = re.findall(r"^(gpuzombie lab run[^#\n]*)", text, flags=re.MULTILINE)
    return [" ".join(s.split()) for s in (*spans, *fenced)]


def concrete(line: str) -> list[str]:
    """argv of ``line`` after `gpuzombie lab run`: optional parts kept, placeholders filled in."""
    words = line.replace("[", " ").replace("]", " ").split()[3:]
    return [PLACEHOLDERS.get(w, w.split("|")[-1]) for w in words]


@pytest.mark.parametrize("page", ["nccl", "lab"])
def test_every_documented_lab_run_line_parses(page):
    lines = documented_runs(page)
    assert lines, f"docs/{page}.md names no `gpuzombie lab run` line"
    for line in lines:
        try:
            run_command.make_context("run", concrete(line))
        except click.UsageError as exc:
            pytest.fail(f"docs/{page}.md: `{line}`: {exc.format_message()}")


def test_every_option_docs_nccl_names_is_in_the_help():
    help_text = CliRunner().invoke(run_command, ["--help"]).output
    named = {w for line in documented_runs("nccl") for w in re.findall(r"--[a-z][a-z-]+", line)}
    assert {"--observe-seconds", "--budget-seconds", "--cases", "--collective-timeout"} <= named
    assert not [o for o in sorted(named) if o not in help_text]


def test_an_nccl_option_with_another_scenario_is_one_line_error(tmp_path, capsys):
    from gpuzombie.cli.main import main

    argv = ["lab", "run", "--scenario", "s1-nofix", "--observe-seconds", "5", "--cases", "ab"]
    assert main([*argv, "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "gpuzombie: error: --cases, --observe-seconds: only with --scenario nccl\n", err


def test_the_nccl_module_has_no_cli_of_its_own():
    """One CLI: `python -m gpuzombie.lab.nccl` (the former argparse one) is gone."""
    import importlib.util

    assert importlib.util.find_spec("gpuzombie.lab.nccl.__main__") is None
