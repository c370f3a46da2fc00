"""The package's layering: the import-linter contracts in pyproject.toml ([tool.importlinter]; cli →
features (in their order) → adapters → base, the node image never imports what it leaves out,
admission never imports the node agent, no import cycle inside k8s/ nor between cli/lab.py and
cli/labpod.py) hold on the source, and a forbidden import breaks them; every failure the lab raises
is a ``GpuzombieError`` (one line, exit 2); no function is longer than 80 lines."""

from __future__ import annotations

import ast
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


def test_the_node_image_contract_forbids_what_the_image_leaves_out() -> None:
    """docker/node-excludes.txt (what the node image's wheel stage removes) and the contract that
    nothing left in the image imports it name the same modules."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (image,) = [c for c in contracts if c["name"].startswith("the node image")]
    lines = (ROOT / "docker" / "node-excludes.txt").read_text().splitlines()
    excluded = {"gpuzombie." + line.removesuffix(".py").replace("/", ".") for line in lines if line and line[0] != "#"}
    assert set(image["forbidden_modules"]) == excluded


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_80_lines() -> None:
    """A function longer than a screen mixes jobs (issue 34): split it along them."""
    long = []
    for path in sorted((SRC / "gpuzombie").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)
