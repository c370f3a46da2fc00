"""The preStop hook's two parsers agree: ``gpuzombie prestop`` (click) and ``python3 -m
gpuzombie.prestop`` (argparse, the stdlib zipapp) are both built from ``prestop.options.OPTIONS``.

On 241ae16 each had its own list: ``--nvml`` existed only in the stdlib hook, ``--pid1-log`` only in
click, and a bad ``GPUZOMBIE_PRESTOP_PID1_LOG`` was an error in one and "on" in the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.types import BoolParamType

from gpuzombie.cli.prestop import command
from gpuzombie.prestop.hook import build_parser, parse_hook_args
from gpuzombie.prestop.options import BOOL_WORDS, OPTIONS, HookOptions
from gpuzombie.usage import UsageError
from markers import needs_root

SRC = str(Path(__file__).resolve().parents[1] / "src")
IN_A_PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]

CASES = [
    [],
    ["--timeout", "5", "--kill-wait", "0.5"],
    ["--dry-run", "--no-orphans", "--same-cgroup", "--json"],
    ["--nvml", "undecided"],
    ["--nvml", "never", "--no-nvml"],
    ["--cgroup", "/kubepods.slice/x", "--container", "0123456789abcdef"],
    ["--no-pid1-log"],
    ["--no-pid1-log", "--pid1-log"],
    ["--procfs", "/host/proc"],
    ["--timeout", "nan"],
    ["--timeout", "-1"],
    ["--kill-wait", "x"],
    ["--nvml", "sometimes"],
    ["--no-such-flag"],
]
ENVIRONMENTS = [
    {},
    {"GPUZOMBIE_PRESTOP_TIMEOUT": "7"},
    {"GPUZOMBIE_PRESTOP_TIMEOUT": "abc"},
    {"GPUZOMBIE_PRESTOP_TIMEOUT": "inf"},
    {"GPUZOMBIE_PRESTOP_PID1_LOG": "0"},
    {"GPUZOMBIE_PRESTOP_PID1_LOG": " Off "},
    {"GPUZOMBIE_PRESTOP_PID1_LOG": "yes"},
    {"GPUZOMBIE_PRESTOP_PID1_LOG": "maybe"},
    {"GPUZOMBIE_PRESTOP_PID1_LOG": ""},
    {"GPUZOMBIE_PROCFS": "/host/proc"},
]


def _click(argv: list[str]) -> dict | None:
    """What ``gpuzombie prestop`` would run with; None for a usage error."""
    try:
        with command.make_context("prestop", list(argv)) as ctx:
            return dict(ctx.params)
    except click.UsageError:
        return None


def _argparse(argv: list[str]) -> dict | None:
    """What ``python3 -m gpuzombie.prestop`` would run with; None for a usage error."""
    try:
        return parse_hook_args(argv, "prestop")
    except Exception as exc:  # the hook's one-line usage error (its parser raises instead of exiting)
        assert type(exc) is UsageError, exc
        return None


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v!r}" for k, v in e.items()) or "no-env")
@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a) or "no-args")
def test_both_parsers_give_the_same_options(argv, env, monkeypatch):
    for name in ("GPUZOMBIE_PRESTOP_TIMEOUT", "GPUZOMBIE_PRESTOP_PID1_LOG", "GPUZOMBIE_PROCFS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from_click, from_argparse = _click(argv), _argparse(argv)
    assert from_click == from_argparse
    if from_click is not None:
        HookOptions(**from_click)  # one field an option: run_hook takes exactly what both parse


def test_every_option_of_the_table_is_a_flag_of_both_parsers():
    click_flags = {flag for p in command.params for flag in (*p.opts, *p.secondary_opts)} - {"--help"}
    argparse_flags = {flag for action in build_parser("prestop")._actions for flag in action.option_strings}
    assert click_flags == argparse_flags - {"-h", "--help"}
    assert {o.flag for o in OPTIONS} <= click_flags
    assert {o.name for o in OPTIONS} == set(HookOptions.__dataclass_fields__)


def test_a_switch_reads_the_environment_with_clicks_words():
    assert BoolParamType.bool_states == BOOL_WORDS


def test_the_click_command_takes_nvml_as_the_stdlib_hook_does():
    """241ae16: ``gpuzombie prestop --nvml undecided`` was 'No such option'."""
    assert _click(["--nvml", "undecided"]) == _argparse(["--nvml", "undecided"])
    assert _click(["--nvml", "undecided"])["nvml"] == "undecided"


@needs_root
@pytest.mark.parametrize("word", ["off", "OFF", "n", "0"])
def test_pid1_log_turned_off_in_the_environment_is_off_in_the_stdlib_hook(word):
    """241ae16's stdlib hook knew only 0/false/no: ``GPUZOMBIE_PRESTOP_PID1_LOG=off`` left the copy to
    PID 1's stdout on there (click's command turned it off). In a PID namespace of its own, as in a pod."""
    done = subprocess.run(
        [*IN_A_PID_NAMESPACE, sys.executable, "-m", "gpuzombie.prestop", "--json", "--no-nvml"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC, "GPUZOMBIE_PRESTOP_PID1_LOG": word},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pid1_log"] == "off"
