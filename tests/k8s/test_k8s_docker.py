"""docker/Dockerfile: it parses, its COPY sources exist, each image's PID 1 and command are the
scenario's, and every command an image or a pod runs resolves to something gpuzombie installs."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field

import pytest

dockerfile_parse = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse is in the 'chart' extra")

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
PARENT = "gpuzombie.workloads.parent"
IMAGES = ("nofix", "tini", "fullfix", "node")  # the CI matrix targets


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_stages() -> tuple[dict[str, str], dict[str, Stage]]:
    """(global ARG defaults, stages by name) from a real Dockerfile parser."""
    parser = dockerfile_parse.DockerfileParser(str(DOCKERFILE))
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction == "FROM":
            base, _as, name = value.split()
            assert _as.upper() == "AS", value
            current = stages[name] = Stage(name, base)
        elif current is None:
            assert instruction == "ARG", f"only ARG may precede the first FROM, not {instruction}"
            key, _, default = value.partition("=")
            global_args[key] = default
        else:
            current.instructions.append((instruction, value))
    return global_args, stages


GLOBAL_ARGS, STAGES = parse_stages()


def effective(target: str, instruction: str) -> list[str] | None:
    """ENTRYPOINT or CMD as the built image has it, following FROM <stage> inheritance (an
    ENTRYPOINT set in a stage resets the CMD it inherited, as Docker does)."""
    chain = []
    stage: Stage | None = STAGES[target]
    while stage is not None:
        chain.append(stage)
        stage = STAGES.get(stage.base)
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    for stage in reversed(chain):
        for name, value in stage.instructions:
            if name == "ENTRYPOINT":
                entrypoint, cmd = json.loads(value), None
            elif name == "CMD":
                cmd = json.loads(value)
    return entrypoint if instruction == "ENTRYPOINT" else cmd


def copies(stage: Stage) -> list[tuple[str | None, list[str]]]:
    """(--from stage or None, sources) of every COPY."""
    found = []
    for name, value in stage.instructions:
        if name != "COPY":
            continue
        words = value.split()
        source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        paths = [w for w in words if not w.startswith("--")]
        found.append((source_stage, paths[:-1]))
    return found


def test_every_image_is_a_build_target():
    assert set(IMAGES) <= set(STAGES)


def test_bases_are_pinned_build_args():
    torch_base, node_base, go_base = GLOBAL_ARGS["TORCH_BASE"], GLOBAL_ARGS["NODE_BASE"], GLOBAL_ARGS["GO_BASE"]
    # A PyTorch CUDA runtime image GPU users run, by exact version; never :latest.
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", torch_base)
    assert re.fullmatch(r"python:3\.\d+(\.\d+)?-slim-\w+", node_base)
    assert re.fullmatch(r"golang:1\.\d+(\.\d+)?-\w+", go_base)  # the NRI plugin's build stage
    for stage in STAGES.values():
        assert stage.base in STAGES or stage.base in ("${TORCH_BASE}", "${NODE_BASE}", "${GO_BASE}"), stage.base


def test_copy_sources_exist_and_pass_the_dockerignore():
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split("\n")
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    order = list(STAGES)
    for stage in STAGES.values():
        for source_stage, sources in copies(stage):
            if source_stage is not None:  # an earlier stage, never an external image
                assert order.index(source_stage) < order.index(stage.name), (stage.name, source_stage)
                continue
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source} in stage {stage.name}: no such path"
                assert any(fnmatch.fnmatch(source.rstrip("/"), a) for a in allowed), source


def test_workload_images_install_tini_from_the_distribution_and_gpuzombie():
    runs = " ".join(value for name, value in STAGES["workload"].instructions if name == "RUN")
    assert re.search(r"apt-get install .*\btini\b", runs)
    assert "pip install" in runs and "/tmp/wheels/*.whl" in runs


def test_non_root_variant_is_a_build_arg():
    workload = dict(STAGES["workload"].instructions)
    assert workload["ARG"] == "USER_UID=0"
    assert workload["USER"] == "${USER_UID}"


def test_pid1_is_the_scenario_init():
    assert effective("nofix", "ENTRYPOINT") == []
    assert effective("tini", "ENTRYPOINT") == ["/usr/bin/tini", "--"]
    assert effective("fullfix", "ENTRYPOINT") == ["/usr/bin/tini", "--"]
    assert effective("node", "ENTRYPOINT") is None
    assert "--fixed" in effective("fullfix", "CMD")[-1]
    assert "--fixed" not in effective("tini", "CMD")[-1]


@pytest.mark.parametrize(("target", "init"), [("nofix", "sleep"), ("tini", "tini"), ("fullfix", "tini")])
def test_image_command_is_the_lab_pod_command(target, init):
    """The image runs what `gpuzombie lab` runs for the scenario (tini's path and -s aside)."""
    lab_pod = pytest.importorskip("gpuzombie.lab.runtime.pidns", reason="the lab is not built yet")
    argv = (effective(target, "ENTRYPOINT") or []) + effective(target, "CMD")
    main = re.search(r"python3 -m [\w.]+( --fixed)?", argv[-1]).group(0)
    lab = lab_pod.init_argv(init, main)

    def normalized(words: list[str]) -> list[str]:
        return [pathlib.PurePath(words[0]).name] + [word for word in words[1:] if word != "-s"]

    assert normalized(lab) == normalized(argv)


def _python_commands(script: str) -> list[list[str]]:
    """Each `python3 -m ...` or `gpuzombie ...` command of a `sh -c` script."""
    commands = []
    for part in re.split(r"&&|;|&|\|", script):
        words = shlex.split(part)
        if words and words[0] in ("python3", "gpuzombie"):
            commands.append(words)
        elif words[:1] == ["while"] and "gpuzombie" in words:
            commands.append(words[words.index("gpuzombie") :])
    return commands


def _assert_resolves(words: list[str]) -> None:
    """The module or console script exists and accepts the flags given (checked by its --help)."""
    if words[0] == "python3":
        assert words[1] == "-m"
        module = words[2]
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not written yet")
        argv = [sys.executable, "-m", module]
        flags = [w for w in words[3:] if w.startswith("--")]
    else:
        scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
        assert scripts["gpuzombie"] == "gpuzombie.cli.main:main"
        argv = [sys.executable, "-m", "gpuzombie", words[1]]
        flags = [w for w in words[2:] if w.startswith("--")]
    help_text = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0, help_text.stderr
    for flag in flags:
        assert flag in help_text.stdout, f"{' '.join(words)}: {flag} unknown"


@pytest.mark.parametrize("target", IMAGES)
def test_image_command_resolves(target):
    cmd = effective(target, "CMD")
    if cmd[0] == "gpuzombie":  # the node image runs the exporter directly as PID 1
        commands = [cmd]
    else:
        assert cmd[:2] == ["sh", "-c"]
        commands = _python_commands(cmd[2])
    assert commands, cmd
    for words in commands:
        _assert_resolves(words)


def test_pod_commands_resolve():
    """What the chart's pods run: the parent with the chart's flags, the preStop hook, trace."""
    k8s_support = pytest.importorskip("k8s_support", reason="the 'chart' extra is not installed")
    seen = 0
    for obj in k8s_support.render().values():
        spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"]
        for container in spec["containers"]:
            args = container["args"]
            for words in [args] if args[0] == "gpuzombie" else _python_commands(args[2]):
                _assert_resolves(words)
                seen += 1
            pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            if pre_stop:
                _assert_resolves(pre_stop)
                seen += 1
    assert seen == 4 + 2 + 1  # four parents, two preStop hooks, the exporter


def test_node_image_ships_what_the_webhooks_init_container_copies():
    """ADMISSION-CONTRACT.md: /usr/bin/tini-static (Debian's tini) and /opt/gpuzombie/prestop.pyz,
    built by the zipapp module after gpuzombie is installed."""
    runs = [value for name, value in STAGES["node"].instructions if name == "RUN"]
    install = next(i for i, r in enumerate(runs) if "pip install" in r)
    hook = next(i for i, r in enumerate(runs) if "gpuzombie.prestop.zipapp /opt/gpuzombie/prestop.pyz" in r)
    assert install < hook and re.search(r"apt-get install .*\btini\b", runs[hook])
    gate = next(i for i, r in enumerate(runs) if "zipapp --app preflight /opt/gpuzombie/preflight.pyz" in r)
    assert install < gate  # the handover gate the webhook's preflight container runs (docs/handover.md)
    assert importlib.util.find_spec("gpuzombie.prestop.zipapp") is not None


NODE_EXCLUDES = REPO / "docker" / "node-excludes.txt"


def node_excludes() -> list[str]:
    """The paths under src/gpuzombie/ the node image leaves out, as the wheel stage reads them."""
    lines = (re.sub(r"#.*", "", line).strip() for line in NODE_EXCLUDES.read_text().splitlines())
    return [line for line in lines if line]


def test_node_image_installs_the_wheel_without_the_lab():
    """The wheel stage builds /node-wheels from the sources less docker/node-excludes.txt, and the
    node stage installs that one; the workload images keep the whole wheel (they run the workloads)."""
    wheel_runs = " ".join(value for name, value in STAGES["wheel"].instructions if name == "RUN")
    assert "/tmp/node-excludes.txt" in wheel_runs and "xargs rm -r" in wheel_runs
    assert "--wheel-dir /node-wheels /node-src" in wheel_runs
    assert (("wheel", ["/node-wheels"])) in copies(STAGES["node"])
    assert ("wheel", ["/wheels"]) not in copies(STAGES["node"])
    assert ("wheel", ["/wheels"]) in copies(STAGES["workload"])
    assert {"lab", "workloads", "cli/lab.py"} <= set(node_excludes())
    for path in node_excludes():
        assert (REPO / "src" / "gpuzombie" / path).exists(), f"docker/node-excludes.txt: no src/gpuzombie/{path}"


@pytest.fixture(scope="module")
def node_tree(tmp_path_factory) -> pathlib.Path:
    """src/gpuzombie less docker/node-excludes.txt: what the node image's wheel holds."""
    import shutil

    root = tmp_path_factory.mktemp("node-src")
    package = root / "gpuzombie"
    shutil.copytree(REPO / "src" / "gpuzombie", package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in node_excludes():
        (shutil.rmtree if (package / path).is_dir() else pathlib.Path.unlink)(package / path)
    return root


def run_in(tree: pathlib.Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python argv`` with ``tree`` as the only gpuzombie on the path (this venv's dependencies)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=tree)


def test_every_module_the_node_image_ships_imports_without_the_lab(node_tree):
    """Nothing the node agent or the webhook runs imports what the node image leaves out."""
    script = (
        "import importlib, json, pkgutil, gpuzombie\n"
        "failed = {}\n"
        "for m in pkgutil.walk_packages(gpuzombie.__path__, 'gpuzombie.'):\n"
        "    if m.name.endswith('.__main__'):\n"  # it would run the command
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except ImportError as e:\n"
        "        failed[m.name] = str(e)\n"
        "print(json.dumps([gpuzombie.__path__[0], failed]))\n"
    )
    found = run_in(node_tree, "-c", script)
    assert found.returncode == 0, found.stderr
    path, failed = json.loads(found.stdout)
    assert path == str(node_tree / "gpuzombie")
    assert failed == {}


def test_the_node_images_commands_run_and_lab_is_no_command(node_tree):
    help_text = run_in(node_tree, "-m", "gpuzombie", "--help")
    assert help_text.returncode == 0, help_text.stderr
    listed = re.findall(r"^  (\w+)", help_text.stdout.split("Commands:")[1], flags=re.M)
    assert listed and "lab" not in listed and {"exporter", "trace", "reap", "prestop", "webhook"} <= set(listed)
    for command in listed:
        assert run_in(node_tree, "-m", "gpuzombie", command, "--help").returncode == 0, command
    lab = run_in(node_tree, "-m", "gpuzombie", "lab", "run")
    assert lab.returncode == 2 and lab.stderr.count("\n") == 1 and "No such command 'lab'" in lab.stderr, lab.stderr
    hook = run_in(node_tree, "-m", "gpuzombie.prestop.zipapp", str(node_tree / "prestop.pyz"))
    assert hook.returncode == 0, hook.stderr
    assert run_in(node_tree, "-S", "-I", str(node_tree / "prestop.pyz"), "--help").returncode == 0
    gate = run_in(node_tree, "-m", "gpuzombie.prestop.zipapp", "--app", "preflight", str(node_tree / "preflight.pyz"))
    assert gate.returncode == 0, gate.stderr
    assert run_in(node_tree, "-S", "-I", str(node_tree / "preflight.pyz"), "--help").returncode == 0
