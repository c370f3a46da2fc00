"""The CLI starts light: a command imports only its own module, and observe, trace and prestop pull in
no rich, matplotlib, prometheus-client or torch (they run in containers and preStop hooks)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("rich", "matplotlib", "prometheus_client", "torch")
PROBE = """
import sys
from gpuzombie.cli.main import main
main({argv!r})
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r} or m.startswith("gpuzombie.cli."))
print(" ".join(loaded), file=sys.stderr)
"""


def modules_loaded_by(*argv: str) -> set[str]:
    probe = PROBE.format(argv=list(argv), heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stderr.strip().splitlines()[-1].split())


@pytest.mark.parametrize("command", ["observe", "trace", "prestop"])
def test_a_command_imports_only_itself_and_no_heavy_library(command):
    loaded = modules_loaded_by(command, "--help")
    assert {m for m in loaded if m.startswith("gpuzombie.cli.")} <= {
        "gpuzombie.cli.main",
        "gpuzombie.cli.common",
        f"gpuzombie.cli.{command}",
    }
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}, loaded


def test_observe_runs_without_a_heavy_library():
    loaded = modules_loaded_by("observe", "--json")
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}, loaded
