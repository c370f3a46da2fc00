"""The package's layering, read from the source with ast: the node agent never imports the lab's
infrastructure, and no two modules of ``k8s/`` import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gpuzombie"
NODE_AGENT = ("k8s", "exporter", "trace", "observe", "prestop", "proc", "gpu")


def imports_of(path: Path) -> set[str]:
    """Every ``gpuzombie.*`` module the file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuzombie"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpuzombie"))
    return found


@pytest.mark.parametrize("package", NODE_AGENT)
def test_node_agent_never_imports_the_lab(package: str) -> None:
    offenders = {
        str(p.relative_to(SRC)): sorted(m for m in imports_of(p) if m.startswith("gpuzombie.lab"))
        for p in (SRC / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_k8s_modules_have_no_import_cycle() -> None:
    modules = {p.stem: p for p in (SRC / "k8s").glob("*.py") if p.stem != "__init__"}
    edges = {
        name: {m.split(".")[2] for m in imports_of(path) if m.startswith("gpuzombie.k8s.") and m.count(".") >= 2}
        & modules.keys()
        for name, path in modules.items()
    }
    cycles = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))
    assert cycles == []
