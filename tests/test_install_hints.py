"""Issue 26 (7): what a command says when an optional extra is missing names an install that works from
the clone: the project venv's pip, the clone itself (-e .), an extra pyproject.toml has. Never
`pip install 'gpuzombie[...]'`: gpuzombie is not on PyPI, so that line installs whatever a stranger
published under the name. Each command runs as a real process with the extra's modules hidden."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from docs import REPO
from test_optional_extras import BLOCKER

EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
VENV = re.search(r"^VENV \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)[1]
HINT = re.compile(r"in the gpuzombie clone run (.+?) \(")

# command line, the modules hidden (as without the extra), the extra the hint must name
MISSING = [
    (["check", "deploy/pod-nofix.yaml"], {"yaml"}, "admission"),
    (["webhook", "--patch", "deploy/pod-nofix.yaml"], {"ruamel"}, "admission"),
    (["exporter", "--listen", "127.0.0.1:0"], {"prometheus_client"}, "exporter"),
    (["top", "--procfs", "/proc"], {"textual"}, "top"),
    (["lab", "pod", "deploy/pod-nofix.yaml"], {"yaml"}, "labpod"),
]


def test_every_hint_in_the_package_names_an_extra_pyproject_has():
    named = []
    for path in (REPO / "src" / "gpuzombie").rglob("*.py"):
        text = path.read_text()
        assert "pip install 'gpuzombie[" not in text and "needs gpuzombie[" not in text, path
        for call in ast.walk(ast.parse(text)):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "needs_extra":
                extra = call.args[1]
                assert isinstance(extra, ast.Constant), f"{path}: the extra must be a literal"
                named.extend(extra.value.split(","))
    assert named and set(named) <= set(EXTRAS), set(named) - set(EXTRAS)


def test_the_docs_name_no_install_from_pypi():
    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        assert not re.search(r"pip install [^\n`]*gpuzombie\[", page.read_text()), page


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("argv", "hidden", "extra"), MISSING, ids=[" ".join(m[0][:2]) for m in MISSING])
def test_a_missing_extra_names_the_install_from_the_clone(tmp_path, argv, hidden, extra):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=hidden))
    env = {"PYTHONPATH": f"{tmp_path}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", *argv], capture_output=True, text=True, timeout=60, cwd=REPO, env=env
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    install = shlex.split(HINT.search(done.stderr)[1])
    assert install == [f"{VENV}/bin/pip", "install", "-e", f".[{extra}]"], done.stderr
    # The named install resolves from the clone with that extra (offline: the test venv has every extra).
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation"]
    resolved = subprocess.run([*pip, *install[2:]], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert resolved.returncode == 0 and "does not provide the extra" not in resolved.stderr, resolved.stderr


def _every_command(group=None, path=()):
    """(path, click command) of every command and subcommand, as `gpuzombie ... --help` reaches them."""
    import click

    from gpuzombie.cli.main import cli

    group = group or cli
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _every_command(command, (*path, name))


def test_every_command_the_help_texts_name_exists():
    """A `gpuzombie X Y` in any --help text (or an install line in one) names a command there is."""
    import click

    commands = dict(_every_command())
    for path, command in commands.items():
        text = command.get_help(click.Context(command, info_name=" ".join(("gpuzombie", *path))))
        assert "gpuzombie[" not in text, path
        for named in re.findall(r"\bgpuzombie((?: [a-z][a-z-]*)+)", text):
            words = tuple(named.split())
            known = [words[:n] for n in range(len(words), 0, -1) if words[:n] in commands]
            assert known, f"gpuzombie {' '.join(path)} --help names 'gpuzombie{named}', which is no command"


def test_the_nccl_scenario_without_torch_names_the_cpu_build_and_its_make_target(tmp_path):
    """Issue 35 (8): the hint was `pip install torch`, which takes PyPI's CUDA build (about 5 GB with
    its CUDA wheels). It names `make torch` now, the CPU build of the version the test extra pins."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked={"torch"}))
    env = {"PYTHONPATH": f"{tmp_path}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"}
    argv = ["lab", "run", "--scenario", "nccl", "--device", "cpu", "--out", str(tmp_path / "out")]
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", *argv], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    pin = next(r for r in EXTRAS["test"] if r.startswith("torch=="))
    makefile = (REPO / "Makefile").read_text()
    version = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, re.MULTILINE)[1]
    index = re.search(r"^TORCH_INDEX \?= (\S+)$", makefile, re.MULTILINE)[1]
    assert pin == f"torch=={version}" and index.endswith("/whl/cpu")
    assert "`make torch`" in line and f"{VENV}/bin/pip install {pin} --index-url {index}" in line
    dry = subprocess.run(["make", "-n", "torch"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert f"-m pip install -q '{pin}' --index-url {index}" in dry.stdout, dry.stdout
    assert "torch" in subprocess.run(["make", "help"], capture_output=True, text=True, cwd=REPO).stdout
