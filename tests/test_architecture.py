"""The package's layering: the import-linter contracts in pyproject.toml ([tool.importlinter]; cli →
features → adapters → base, the node agent never imports the lab, admission never imports the node
agent, no import cycle inside k8s/ nor between cli/lab.py and cli/labpod.py) hold on the source, and a
forbidden import breaks them; every failure the lab raises is a ``GpuzombieError`` (one line, exit 2)."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))"
)


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``src`` with the project's contracts."""
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run(
        [sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=src,
        timeout=120,
        check=False,
    )


def test_the_import_contracts_hold() -> None:
    done = lint_imports(SRC)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout


def test_an_adapter_importing_the_lab_breaks_two_contracts(tmp_path: Path) -> None:
    """The contracts are not vacuous: proc/ importing the lab breaks the layers and the node-agent rule."""
    shutil.copytree(SRC / "gpuzombie", tmp_path / "gpuzombie", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "gpuzombie" / "proc" / "own.py").open("a") as f:
        f.write("\nimport gpuzombie.lab.events  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 broken" in done.stdout and "gpuzombie.proc.own -> gpuzombie.lab.events" in done.stdout


def test_every_lab_exception_is_a_gpuzombie_error() -> None:
    """The CLI turns a GpuzombieError into one line and exit 2; a lab failure of another type would
    be a traceback (five types before, one of them a GpuzombieError)."""
    pytest.importorskip("grpc", reason="the lab's CRI runtime is in the 'node' extra")
    import gpuzombie.lab
    from gpuzombie.errors import GpuzombieError

    found = {}
    for info in pkgutil.walk_packages(gpuzombie.lab.__path__, "gpuzombie.lab."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = issubclass(value, GpuzombieError)
    assert len(found) >= 5
    assert {name for name, ok in found.items() if not ok} == set()
