"""Build the fast preStop hook: a self-contained, stdlib-only zipapp of ``gpuzombie.prestop``.

    python -m gpuzombie.prestop.zipapp OUT.pyz
    python -m gpuzombie.prestop.zipapp --app preflight OUT.pyz   # the handover gate, the same way

The admission webhook's init container copies it beside tini, and the injected hook runs it as
``python3 -S -I <dir>/prestop.pyz``: no site (a training image's site-packages with torch's .pth
files cost most of the old hook's start-up), no PYTHONPATH, and only the modules the hook imports,
each with its bytecode (compiled by the Python that builds it; another version falls back to the
source beside it). In the archive the hook asks NVML only when the /proc fd scan could not read
every process (``--nvml undecided``); NVML's binding is then looked up in the image's own
site-packages, the one place outside the standard library it ever looks.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import os
import py_compile
import sys
import tempfile
import zipapp
import zipfile
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "gpuzombie"
ENTRY = "gpuzombie.prestop.hook"
OPTIONAL = frozenset({"pynvml"})
"""Imported lazily and only when NVML is asked (a missing one is a reported state, not an error)."""
OLDEST = (3, 10)
"""The oldest Python the hook's sources run on (a training image's python3 may be older than ours)."""
_VERSION_CHECK = f"""\
import sys

if sys.version_info < {OLDEST!r}:
    print("gpuzombie: error: this archive needs Python >= {".".join(map(str, OLDEST))}, this is "
          + sys.version.split()[0], file=sys.stderr)
    sys.exit(2)
"""
MAIN = (
    _VERSION_CHECK
    + """from gpuzombie.prestop.hook import main

sys.exit(main(prog="python3 -S -I prestop.pyz", nvml_default="undecided"))
"""
)
PREFLIGHT_MAIN = (
    _VERSION_CHECK
    + """from gpuzombie.handover.preflight import main

sys.exit(main(prog="python3 -S -I preflight.pyz"))
"""
)
APPS = {"prestop": (ENTRY, MAIN), "preflight": ("gpuzombie.handover.preflight", PREFLIGHT_MAIN)}
"""The archives this builds: the preStop hook, and the handover gate's preflight (docs/handover.md)."""


class ZipappError(Exception):
    """The hook's modules import something outside the standard library (or cannot be found)."""


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ZipappError(f"{module}: no Python source to put in the archive")
    return Path(spec.origin)


def _imports(module: str, path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function (absolute names)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            # ``from pkg import name``: name may be a submodule
            found.update(f"{base}.{alias.name}" for alias in node.names if base.startswith(PACKAGE))
    return found


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def hook_modules(entry: str = ENTRY) -> dict[str, Path]:
    """The project's modules the hook needs (its package ``__init__``s included), by name; raises
    ZipappError when any of them imports a module outside the standard library."""
    todo, found, outside = [entry], {}, set()
    while todo:
        module = todo.pop()
        if module in found:
            continue
        path = _source(module)
        found[module] = path
        todo.extend(_parents(module))
        for name in _imports(module, path):
            top = name.partition(".")[0]
            if top == PACKAGE:
                if _is_module(name):  # ``from gpuzombie.x import name``: a submodule, or only a name
                    todo.append(name)
            elif top not in sys.stdlib_module_names and top not in OPTIONAL and top != "__future__":
                outside.add(f"{name} (in {module})")
    if outside:
        raise ZipappError("the hook imports outside the standard library: " + ", ".join(sorted(outside)))
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _archive_name(module: str, path: Path) -> str:
    stem = module.replace(".", "/")
    return f"{stem}/__init__.py" if path.name == "__init__.py" else f"{stem}.py"


def _bytecode(source: Path, name: str) -> bytes:
    """The module compiled by this Python, marked unchecked (the zip's mtimes mean nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.pyc")
        py_compile.compile(
            str(source),
            cfile=out,
            dfile=name,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        return Path(out).read_bytes()


def _entries(modules: dict[str, Path]) -> Iterable[tuple[str, bytes]]:
    for module, path in sorted(modules.items()):
        name = _archive_name(module, path)
        yield name, path.read_bytes()
        yield name + "c", _bytecode(path, name)


def build(out: str | os.PathLike[str], *, interpreter: str | None = None, app: str = "prestop") -> Path:
    """Write the archive of ``app`` (one of APPS) to ``out`` (atomically: a half-written hook is never
    run); its path."""
    entry, main = APPS[app]
    modules = hook_modules(entry)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in _entries(modules):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, data)
        zf.writestr(zipfile.ZipInfo("__main__.py", date_time=(1980, 1, 1, 0, 0, 0)), main)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    buf.seek(0)
    with open(tmp, "wb") as f:
        zipapp.create_archive(buf, f, interpreter=interpreter)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuzombie.prestop.zipapp", description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the archive to write, e.g. /opt/gpuzombie/prestop.pyz")
    ap.add_argument("--list", action="store_true", help="print the modules put in it")
    ap.add_argument("--app", choices=sorted(APPS), default="prestop", help="which archive (default prestop)")
    args = ap.parse_args(argv)
    try:
        path = build(args.out, app=args.app)
    except (ZipappError, OSError, SyntaxError) as exc:
        print(f"gpuzombie: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(sorted(hook_modules(APPS[args.app][0]))))
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
