"""Names from the CRI runtime over gRPC: what is asked, what is kept across scans, and every fault
(socket absent, not a socket, permission denied, a runtime that never answers, one killed mid-scan)
as ids, one warning, the same exit code, and an exporter that keeps serving."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


from cri_standin import Recorded, standin_runtime
from fakeproc import make_fake_proc, make_fake_root
from gpufakes import gpu_device, gpu_snapshot
from gpuzombie.cli.main import main
from gpuzombie.k8s.names import DEFAULT_SOCKETS, RuntimeNames, find_socket
from markers import needs_root
from pidns import wait_until

TESTS = Path(__file__).resolve().parent
CID = "a" * 64
OTHER = "b" * 64
UID = "11111111-2222-3333-4444-555555555555"
RECORDED = Recorded(
    sandboxes=(("5" * 64, "trainer-0", "ml", UID),),
    listed={CID: ("worker", "trainer-0", "ml", UID)},
    status_only={OTHER: ("sidecar", "trainer-0", "ml", UID)},
)
SHOWN_BY_ID = "pods and containers shown by id"


def test_usual_sockets_in_crictls_order(tmp_path):
    assert DEFAULT_SOCKETS == ("/run/containerd/containerd.sock", "/run/crio/crio.sock", "/var/run/cri-dockerd.sock")
    crio = tmp_path / "crio.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(crio))
        (tmp_path / "containerd.sock").write_text("")  # a file where containerd's socket would be
        assert find_socket(None, [str(tmp_path / "containerd.sock"), str(crio)]) == (str(crio), None)
    assert find_socket(str(crio), []) == (str(crio), None)


def test_names_are_kept_across_scans(tmp_path):
    with standin_runtime(str(tmp_path / "cri.sock"), RECORDED) as calls:
        names = RuntimeNames(str(tmp_path / "cri.sock"))
        first = names([CID])
        assert calls == ["ListPodSandbox", "ListContainers"] and first.warnings == ()
        assert (first.container(CID).pod, first.container(CID).namespace, first.container(CID).container) == (
            "trainer-0",
            "ml",
            "worker",
        )
        assert first.pod(UID).pod == "trainer-0"
        assert names([CID]).container(CID).container == "worker"
        assert len(calls) == 2  # all known: nothing asked
        assert names([CID, OTHER]).container(OTHER).container == "sidecar"  # new id: lists, then status
        assert calls[2:] == ["ListPodSandbox", "ListContainers", f"ContainerStatus {OTHER}"]
        names.close()


def test_an_id_unknown_to_the_runtime_is_asked_once(tmp_path):
    stranger = "c" * 64  # say, a podman container on the same node: not the CRI's
    with standin_runtime(str(tmp_path / "cri.sock"), RECORDED) as calls:
        names = RuntimeNames(str(tmp_path / "cri.sock"))
        got = names([CID, stranger])
        assert got.container(stranger) is None
        assert got.warnings == ("CRI: 1 container(s) unknown to the CRI runtime (e.g. ccccccccccccc): shown by id",)
        names([CID, stranger])
        assert calls == ["ListPodSandbox", "ListContainers", f"ContainerStatus {stranger}"]
        names.close()


# --- faults ----------------------------------------------------------------------------------------


@contextmanager
def _silent(path: Path) -> Iterator[None]:
    """A socket that accepts connections and never says a word (a hung runtime)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen(8)
        yield


@contextmanager
def _dies_mid_scan(path: Path, tmp_path: Path) -> Iterator[None]:
    """A stand-in runtime in its own process that answers ListPodSandbox and is SIGKILLed at
    ListContainers (a real containerd cannot be killed between two calls on cue)."""
    doc = tmp_path / "recorded.json"
    doc.write_text(json.dumps(dataclasses.asdict(RECORDED)))
    server = subprocess.Popen(
        [sys.executable, str(TESTS / "cri_standin.py"), str(path), str(doc), "ListContainers"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        wait_until(path.exists)
        yield
    finally:
        server.kill()
        server.wait()


@contextmanager
def fault(kind: str, path: Path, tmp_path: Path) -> Iterator[None]:
    if kind == "absent":
        yield
    elif kind == "not-a-socket":
        path.write_text("")
        yield
    elif kind == "never-answers":
        with _silent(path):
            yield
    elif kind == "killed-mid-scan":
        with _dies_mid_scan(path, tmp_path):
            yield
    else:
        raise AssertionError(kind)


FAULTS = {
    "absent": "No such file or directory",
    "not-a-socket": "not a socket",
    "never-answers": "no answer in time",
    "killed-mid-scan": "ListContainers: ",
}


@pytest.mark.parametrize("kind", list(FAULTS))
def test_fault_gives_ids_and_one_warning(kind, tmp_path):
    path = tmp_path / "cri.sock"
    with fault(kind, path, tmp_path):
        t0 = time.monotonic()
        got = RuntimeNames(str(path), timeout=1.0)([CID])
        # The limit holds: at load 15 on 2 cores the slowest (never-answers) took 1.09 s; 2 s margin.
        assert time.monotonic() - t0 < 3
    (warning,) = got.warnings
    assert FAULTS[kind] in warning and warning.endswith(SHOWN_BY_ID) and "\n" not in warning
    assert got.containers == {}


def _skip_unless_uid_can_import(uid: int, module: str) -> None:
    """Skip when ``uid`` cannot run this interpreter on these sources: a clone under a 0700 directory
    (``mktemp -d``) or a pyenv Python under /root is out of an unprivileged uid's reach, which says
    nothing about the code under test (issue 29)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            user=uid,
            group=uid,
            extra_groups=[],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except PermissionError as exc:
        pytest.skip(f"uid {uid} cannot execute {sys.executable}: {exc}")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"uid {uid} cannot import {module} from {sys.path[0]!r} and the rest of sys.path: {last}")


@needs_root
def test_permission_denied_gives_ids_and_one_warning():
    """A real EACCES: a root-only socket, asked by a process that dropped to uid 65534.

    The refusal comes back in 0.02-0.14 s on an idle or stress-ng'd machine, but up to 1.0 s at load
    15 on 2 cores, where a 2 s limit lost the race to "no answer in time" (issue 18). 30 s: no race;
    it costs nothing, since the refusal ends the call at once. The child itself took up to 4.2 s there.
    """
    _skip_unless_uid_can_import(65534, "gpuzombie.k8s.names")
    with tempfile.TemporaryDirectory() as d, standin_runtime(f"{d}/cri.sock", RECORDED) as calls:
        os.chmod(d, 0o755)
        os.chmod(f"{d}/cri.sock", 0o600)
        code = (
            "import json, sys; from gpuzombie.k8s.names import RuntimeNames; "
            f"n = RuntimeNames({d + '/cri.sock'!r}, timeout=30)([{CID!r}]); "
            "print(json.dumps([list(n.warnings), sorted(n.containers)]))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            user=65534,
            group=65534,
            extra_groups=[],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert calls == []
    assert done.returncode == 0, done.stderr
    (warning,), containers = json.loads(done.stdout)
    assert "Permission denied" in warning and warning.endswith(SHOWN_BY_ID) and containers == []


# --- the commands under faults: same exit codes, the exporter keeps serving ------------------------


@pytest.fixture
def node(tmp_path):
    """A node with one zombie in a containerd container: trace's findings, exit 1."""
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    u = UID.replace("-", "_")
    cgroup = (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope\n"
    )
    for pid, ppid, state in ((1, 0, "S"), (20, 1, "S"), (21, 20, "Z")):
        d = make_fake_proc(root, pid, ppid=ppid, state=state, comm="sleep")
        (d / "cgroup").write_text(cgroup if pid > 1 else "0::/init.scope\n")
    replay = tmp_path / "nvml.json"
    idle = gpu_snapshot(gpu_device(0, total=1 << 37))
    replay.write_text(json.dumps(dataclasses.asdict(idle)))
    return root, replay


def _trace(node, sock, capsys) -> tuple[int, dict]:
    root, replay = node
    argv = ["trace", "--json", "--procfs", str(root), "--nvml-replay", str(replay), "--cri-socket", str(sock)]
    code = main([*argv, "--cri-timeout", "1", "--pod-resources-socket", "/nonexistent"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", list(FAULTS))
def test_trace_exit_code_is_unchanged_by_a_fault(kind, node, tmp_path, capsys):
    with standin_runtime(str(tmp_path / "good.sock"), RECORDED):
        code, doc = _trace(node, tmp_path / "good.sock", capsys)
    assert code == 1 and {r["pod"] for r in doc["rows"]} == {"trainer-0"}
    path = tmp_path / "cri.sock"
    with fault(kind, path, tmp_path):
        faulty, doc = _trace(node, path, capsys)
    assert faulty == code
    assert {(r["pod"], r["container_id"]) for r in doc["rows"]} == {(None, CID)}
    assert [w for w in doc["warnings"] if SHOWN_BY_ID in w] == doc["warnings"][:1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


def test_exporter_keeps_serving_when_the_runtime_dies(node, tmp_path):
    root, replay = node
    path, log = tmp_path / "cri.sock", tmp_path / "exporter.log"
    argv = ["exporter", "--listen", "127.0.0.1:0", "--min-interval", "0", "--procfs", str(root)]
    with _dies_mid_scan(path, tmp_path), open(log, "w") as err:
        exporter = subprocess.Popen(
            [sys.executable, "-m", "gpuzombie", *argv, "--nvml-replay", str(replay), "--cri-socket", str(path)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stderr=err,
        )
        try:
            # The port it bound (port 0: no race with other tests for a free one), from its first line.
            port = int(
                wait_until(lambda: re.search(r"serving http://127\.0\.0\.1:(\d+)/", log.read_text()), timeout=60)[1]
            )
            first = _scrape(port)
            # The runtime died at its ListContainers; later scans find no socket to talk to.
            second = _scrape(port)
        finally:
            exporter.send_signal(signal.SIGTERM)
            try:
                exporter.wait(timeout=60)
            except subprocess.TimeoutExpired:
                exporter.kill()
                exporter.wait()
                raise AssertionError(f"the exporter did not stop on SIGTERM: {log.read_text()}") from None
    assert exporter.returncode == 0, log.read_text()
    for text in (first, second):
        assert "gpuzombie_scan_success 1.0" in text
        (zombies,) = [line for line in text.splitlines() if line.startswith("gpuzombie_zombies{")]
        assert f'pod="",pod_uid="{UID}"' in zombies and zombies.endswith(" 1.0")  # no name: never a UID in pod
    warnings = [line for line in log.read_text().splitlines() if "warning" in line]
    assert warnings and all(SHOWN_BY_ID in line for line in warnings), log.read_text()


def test_states_newer_than_the_stubs_are_numbers():
    from gpuzombie.k8s.cri import container_state, sandbox_state

    assert (container_state(1), sandbox_state(0)) == ("CONTAINER_RUNNING", "SANDBOX_READY")
    assert (container_state(42), sandbox_state(7)) == ("42", "7")
