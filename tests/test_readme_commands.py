"""Every command in the README, as written, after its set-up (issue 26 (2): after `make lab` the venv
lacked what `exporter`, `check` and `webhook` need, and a line used a `gpuzombie` that is not on PATH).

A copy of this working tree (what `git clone` of it gives: tracked and untracked, not ignored, files) is
set up with the README's own set-up command, `make lab`; then each command runs there, as a user types
it, through bash. Each command of the README is in exactly one table below, so a new one fails
`test_every_readme_command_is_met_here` until it is run or its reason written down:

- RUN: run as written, with its expected exit codes and a line of output it must show. One rule of
  this test only: a path outside the clone (/opt, /tmp) is redirected into the test's own directory,
  so a test never writes the machine's /opt.
- ELSEWHERE: run with what makes it meaningful here by another test, named.
- NOT_HERE: cannot run on this machine, with the reason.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from docs import REPO, doc
from markers import needs_root

SETUP = "make lab"
NOT_RUN_SETUP = {"make test": "the test suite itself, of which this test is part (it would run itself)"}


@dataclass(frozen=True)
class Expect:
    codes: frozenset[int]
    shows: tuple[str, ...] = ()  # regular expressions the output (stdout + stderr) must each match


FINDINGS_OR_NOT = frozenset({0, 1})  # this machine's own processes decide (observe and trace say 1 for any finding)
RUN = {
    ".venv/bin/gpuzombie observe": Expect(FINDINGS_OR_NOT, (r"\[1\] PID 1",)),
    ".venv/bin/gpuzombie trace": Expect(FINDINGS_OR_NOT, (r"summary: \d+ GPU processes",)),
    ".venv/bin/gpuzombie lab run --grace 2 --size-mib 64 --device cpu --out /tmp/lab": Expect(
        frozenset({0}), (r"CPU STAND-IN", r"s1-nofix")
    ),
    ".venv/bin/gpuzombie check deploy/": Expect(frozenset({0}), (r"GZ001", r"pod-nofix\.yaml", r"0 error\(s\)")),
    ".venv/bin/gpuzombie webhook --patch deploy/pod-nofix.yaml": Expect(
        frozenset({0}), (r"shareProcessNamespace: true",)
    ),
    ".venv/bin/gpuzombie webhook --patch tests/fixtures/labpod/pod-nofix-command.yaml "
    "--image REGISTRY/gpu-zombie/gpuzombie-node:0.1.0": Expect(
        frozenset({0}), (r"/\.gpuzombie/tini-static", r"image: REGISTRY/gpu-zombie/gpuzombie-node:0\.1\.0")
    ),
    ".venv/bin/gpuzombie webhook --patch deploy/pod-nofix.yaml | .venv/bin/gpuzombie lab pod - --grace 5": Expect(
        frozenset({0}), (r"deletion → free \d", r"whole grace \(5 s\) waited: no")
    ),
    "python3 -m venv /opt/gpuzombie && /opt/gpuzombie/bin/pip install '.[exporter]'": Expect(
        frozenset({0}), (r"Successfully installed .*gpuzombie",)
    ),
    ".venv/bin/pip wheel --no-deps -w dist .": Expect(frozenset({0}), (r"gpuzombie-0\.1\.0-py3-none-any\.whl",)),
}
SERVERS = {".venv/bin/gpuzombie exporter": "http://127.0.0.1:9844/metrics"}  # run, scraped, then SIGTERM
SLOW_RUN = {"make image": Expect(frozenset({0}), (r"built localhost/gpu-zombie/gpuzombie-node:",))}
ELSEWHERE = {
    '.venv/bin/gpuzombie cluster up && eval "$(.venv/bin/gpuzombie cluster env)"': (
        "tests/kube/conftest.py starts the real cluster with `gpuzombie cluster up` (its own directory and "
        "instance); tests/kube/test_cluster_node.py runs `cluster env`, `status` and `down`"
    ),
    ".venv/bin/gpuzombie lab run --runtime all --device cpu --grace 5 --out /tmp/lab-all": (
        "tests/kube/test_lab_kubernetes.py runs the kubernetes runtime on the session's cluster; the "
        "namespaces and containerd runtimes run in tests/test_lab*.py"
    ),
    "helm install gpuzombie charts/gpuzombie --namespace gpuzombie "
    "--set image.registry=REGISTRY --set serviceMonitor.enabled=true --set prometheusRule.enabled=true": (
        "tests/cluster/test_cluster_readme.py renders it with the real helm (helm template, same flags); "
        "tests/cluster/test_cluster_pod_security.py installs it on a real API server"
    ),
    "kubectl create namespace gpuzombie": "tests/cluster/test_cluster_pod_security.py runs it on a real API server",
    "kubectl label namespace gpuzombie pod-security.kubernetes.io/enforce=privileged": (
        "tests/cluster/test_cluster_pod_security.py runs it on a real API server, before the helm install"
    ),
    "helm upgrade gpuzombie charts/gpuzombie -n gpuzombie --reuse-values --set webhook.enabled=true": (
        "tests/cluster/test_cluster_readme.py renders it over the install's values: one release, both parts"
    ),
    "helm install gpu-zombie-test charts/gpu-zombie-test -n gpu-zombie-test "
    "--set image.registry=REGISTRY.example.com --set image.repository=gpu-zombie/gpu-zombie-test "
    "--set 'nodeSelector.kubernetes\\.io/hostname=gpu-4'": (
        "tests/k8s/test_k8s_manifests.py::test_readme_helm_flags_render_and_files_exist renders its --set flags"
    ),
}
NO_CLUSTER = "needs a Kubernetes API server (none here); what it applies is validated by tests/k8s"
NOT_HERE = {
    "podman tag localhost/gpu-zombie/gpuzombie-node:0.1.0 REGISTRY/gpu-zombie/gpuzombie-node:0.1.0": (
        "REGISTRY stands for the reader's registry; none is reachable here (make image is run)"
    ),
    "podman push REGISTRY/gpu-zombie/gpuzombie-node:0.1.0": "REGISTRY stands for the reader's registry",
    "kubectl exec POD -- gpuzombie observe --json": NO_CLUSTER + " (observe --json runs in test_observe.py)",
    "kubectl apply -f deploy/namespace.yaml": NO_CLUSTER,
    "kubectl -n gpu-zombie-test create secret docker-registry registry-pull-secret "
    "--docker-server=REGISTRY.example.com --docker-username=USER --docker-password=PASSWORD": NO_CLUSTER,
    "kubectl apply -f deploy/pod-tini-prestop.yaml": NO_CLUSTER,
    "kubectl apply -f argocd-app.yaml": NO_CLUSTER + " and ArgoCD",
}
OUTSIDE_THE_CLONE = ("/opt/gpuzombie", "/tmp/lab")


def readme_commands() -> list[str]:
    """The README's shell commands: each line of its ```sh blocks, continuation lines joined,
    the trailing comment (a # after a space: none of the commands quotes one) dropped."""
    blocks = re.findall(r"^```sh\n(.*?)^```", doc("README"), re.MULTILINE | re.DOTALL)
    lines = [
        re.sub(r"\s+#.*$", "", line).strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()
    ]
    return [re.sub(r" {2,}", " ", line) for line in lines if line]


def test_every_readme_command_is_met_here():
    met = [SETUP, *NOT_RUN_SETUP, *RUN, *SERVERS, *SLOW_RUN, *ELSEWHERE, *NOT_HERE]
    assert len(met) == len(set(met))
    assert sorted(readme_commands()) == sorted(met)


def _clone(to: Path) -> Path:
    """This working tree as a fresh clone of it has it (nothing ignored: no .venv, no build output)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    clone = to / "clone"
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            (clone / name).write_bytes(source.read_bytes())
            (clone / name).chmod(source.stat().st_mode & 0o777)
    return clone


def _as_run_here(command: str, tmp: Path) -> str:
    for path in OUTSIDE_THE_CLONE:
        command = command.replace(path, str(tmp / path.strip("/").replace("/", "-")))
    return command


def _environment() -> dict[str, str]:
    """A root shell's: none of this test run's Python settings leak into the clone's venv."""
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}


def _run(command: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _check(command: str, expect: Expect, done: subprocess.CompletedProcess[str]) -> None:
    out = done.stdout + done.stderr
    assert done.returncode in expect.codes, f"{command}: exit {done.returncode}\n{out[-3000:]}"
    assert "Traceback" not in out, f"{command}:\n{out[-3000:]}"
    for shown in expect.shows:
        assert re.search(shown, out), f"{command}: no {shown!r} in\n{out[-3000:]}"


@pytest.fixture(scope="module")
def set_up(tmp_path_factory) -> Path:
    """A fresh clone after the README's set-up command."""
    tmp = tmp_path_factory.mktemp("readme")
    clone = _clone(tmp)
    done = _run(SETUP, clone, timeout=1500)
    assert done.returncode == 0, f"{SETUP}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}"
    return clone


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("command", list(RUN))
def test_the_readme_command_runs_as_written(set_up, tmp_path, command):
    _check(command, RUN[command], _run(_as_run_here(command, tmp_path), set_up, timeout=600))


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("command", list(SERVERS))
def test_the_readme_server_serves(set_up, command):
    server = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=set_up,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(SERVERS[command], timeout=30) as response:
                    body = response.read().decode()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout and server.stdout.read()
                time.sleep(0.5)
        assert "gpuzombie_" in body
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=60)
    assert server.returncode == 0, out


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("command", list(SLOW_RUN))
def test_the_readme_image_command_runs_as_written(set_up, command):
    """`make image`: 180 s and 416 s in a fresh clone with an empty podman store (docs/cluster.md)."""
    _check(command, SLOW_RUN[command], _run(command, set_up, timeout=1800))
