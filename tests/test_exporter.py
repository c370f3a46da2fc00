"""`gpuzombie exporter`: a fake node (fake /proc with container namespaces, fake NVML) scraped over a
real HTTP server on 127.0.0.1; a real zombie and orphan in a real PID namespace, scraped from the
CLI as a subprocess and stopped with SIGTERM; the min-interval cache; bad addresses."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import gpuzombie

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from docs import doc
from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root
from gpufakes import gpu_device, gpu_process, gpu_snapshot
from gpuzombie.cli.main import main
from gpuzombie.exporter import (
    NodeCollector,
    PrometheusExporter,
    parse_listen,
    scan_node,
)
from gpuzombie.exporter.metrics import GAUGES
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot
from gpuzombie.k8s.names import ContainerNames, CriNames
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.observe.namespaces import survey
from gpuzombie.proc.parse import parse_sigterm
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB
from markers import needs_root, needs_tini
from pidns import PidNamespace, wait_until

CID_A, CID_B, CID_C = "a" * 64, "b" * 64, "c" * 64
UID_A, UID_B, UID_C = (
    "11111111-2222-3333-4444-555555555555",
    "66666666-7777-8888-9999-000000000000",
    "12345678-1234-1234-1234-123456789abc",
)
NS_A, NS_B, NS_C, NS_D, NS_E = 4026533001, 4026533002, 4026533003, 4026533004, 4026533005
SANDBOX_D, SANDBOX_E, UID_D = "d" * 64, "e" * 64, "99999999-8888-7777-6666-555555555555"
SIGTERM_MASK = "0000000000004000"
NONE_MASK = "0000000000000000"


def cgroup(uid: str, cid: str) -> str:
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{cid}.scope\n"
    )


def signals(d: Path, *, blk=NONE_MASK, ign=NONE_MASK, cgt=NONE_MASK) -> None:
    with open(d / "status", "a") as f:
        f.write(f"SigBlk:\t{blk}\nSigIgn:\t{ign}\nSigCgt:\t{cgt}\n")


def container(root: Path, inode: int, uid: str, cid: str, procs: list[dict]) -> None:
    """A container's processes as the node's procfs shows them (host pids, NSpid down to the local
    pid): all the exporter reads. Each proc: host, local, ppid_local, comm, and optional state, fds,
    sig."""
    host_of = {p["local"]: p["host"] for p in procs}
    for p in procs:
        kw = {
            "state": p.get("state", "S"),
            "comm": p["comm"],
            "cmdline": p.get("cmdline", p["comm"].encode() + b"\0"),
            "fds": p.get("fds", ()),
            "pidns": inode,
            "starttime": 1000 + p["local"],
        }
        host = make_fake_proc(root, p["host"], ppid=host_of.get(p["ppid"], 50), nspid=(p["host"], p["local"]), **kw)
        (host / "cgroup").write_text(cgroup(uid, cid))
        signals(host, **p.get("sig", {}))


def build_node(root: Path) -> None:
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0", pidns=TREE_PIDNS)
    make_fake_proc(root, 50, ppid=1, comm="containerd-shim", pidns=TREE_PIDNS)
    # Host: a process holding /dev/nvidia0 that NVML does not list (NSMI=N).
    make_fake_proc(root, 90, ppid=1, comm="bash", fds=("/dev/nvidia0",), pidns=TREE_PIDNS)
    gpu0, gpu1 = ("/dev/nvidia0", "/dev/nvidiactl"), ("/dev/nvidia1", "/dev/nvidiactl")
    # Scenario 1: PID 1 `sleep` (no handler: drops SIGTERM), an orphaned worker and a zombie worker.
    container(
        root,
        NS_A,
        UID_A,
        CID_A,
        [
            {"host": 200, "local": 1, "ppid": 0, "comm": "sleep", "cmdline": b"sleep\0infinity\0"},
            {"host": 201, "local": 7, "ppid": 1, "comm": "python3", "fds": gpu0, "sig": {"ign": SIGTERM_MASK}},
            {"host": 202, "local": 8, "ppid": 1, "comm": "python3", "state": "Z", "cmdline": b""},
        ],
    )
    # Scenario 2: tini forwards SIGTERM to its child, which ignores it.
    container(
        root,
        NS_B,
        UID_B,
        CID_B,
        [
            {
                "host": 300,
                "local": 1,
                "ppid": 0,
                "comm": "tini",
                "cmdline": b"tini\0--\0python3\0",
                "sig": {"blk": SIGTERM_MASK},
            },
            {"host": 301, "local": 2, "ppid": 1, "comm": "python3", "fds": gpu1, "sig": {"ign": SIGTERM_MASK}},
        ],
    )
    # Scenario 4: tini and a child with a SIGTERM handler: no grace risk.
    container(
        root,
        NS_C,
        UID_C,
        CID_C,
        [
            {
                "host": 400,
                "local": 1,
                "ppid": 0,
                "comm": "tini",
                "cmdline": b"tini\0--\0python3\0",
                "sig": {"blk": SIGTERM_MASK},
            },
            {"host": 401, "local": 2, "ppid": 1, "comm": "python3", "fds": gpu1, "sig": {"cgt": SIGTERM_MASK}},
        ],
    )
    # A pod sharing its process namespace: pause is PID 1, a container's process its re-parented child.
    container(
        root,
        NS_D,
        UID_D,
        SANDBOX_D,
        [
            {"host": 600, "local": 1, "ppid": 0, "comm": "pause", "cmdline": b"/pause\0"},
            {"host": 601, "local": 9, "ppid": 1, "comm": "python3"},
        ],
    )
    # A bare sandbox (no shared namespace): pause alone, nothing to judge.
    container(
        root, NS_E, UID_D, SANDBOX_E, [{"host": 700, "local": 1, "ppid": 0, "comm": "pause", "cmdline": b"/pause\0"}]
    )


def gpus() -> GpuSnapshot:
    # GPU0: the orphaned worker and 1000 MiB nobody accounts for (a ghost); GPU1: two workers.
    return gpu_snapshot(
        gpu_device(0, uuid="GPU-0000", used=(615 + 2658 + 1000) * MIB, processes=[gpu_process(201)]),
        gpu_device(1, uuid="GPU-1111", processes=[gpu_process(301, mib=2000), gpu_process(401, mib=1000)]),
        driver_version="580.159.04",
    )


def names(ids) -> CriNames:
    known = {CID_A: ("gpu-zombie-nofix", "worker", UID_A), CID_B: ("gpu-zombie-tini", "worker", UID_B)}
    found = {
        cid: ContainerNames(cid, c, pod, "gpu-zombie-test", uid, "CONTAINER_RUNNING")
        for cid, (pod, c, uid) in known.items()
        if cid in set(ids)
    }
    found[SANDBOX_D] = ContainerNames(SANDBOX_D, "POD", "shared-pidns", "training", UID_D, "SANDBOX_READY")
    return CriNames(source="fake", containers=found)


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "proc"
    build_node(root)
    return root


def fake_scan(node):
    return scan_node(
        procfs=Procfs(str(node)),
        nvml=FakeNvml(gpus()),
        view=ReaderView(in_root_pidns=True),
        names=names,
        resources=lambda: PodResources(source=None),
        node_name="gpu-node-1",
    )


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value}; samples of counters under their _total name."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


def labels(**kw: str) -> tuple:
    return tuple(sorted(kw.items()))


def pod(namespace="", name="", container="", uid="", **extra):
    return labels(namespace=namespace, pod=name, pod_uid=uid, container=container, **extra)


@pytest.fixture
def served(node):
    registry = CollectorRegistry()
    collector = NodeCollector(lambda: fake_scan(node), min_interval=60)
    registry.register(collector)
    exporter = PrometheusExporter(registry, listen=parse_listen("127.0.0.1:0"))
    bound = exporter.start()
    yield f"http://127.0.0.1:{bound.port}/metrics", collector
    exporter.stop()


def test_fake_node_metrics_over_http(served):
    url, _ = served
    m = scrape(url)
    nofix = {"namespace": "gpu-zombie-test", "name": "gpu-zombie-nofix", "uid": UID_A, "container": "worker"}
    tini = {"namespace": "gpu-zombie-test", "name": "gpu-zombie-tini", "uid": UID_B, "container": "worker"}
    fullfix = {"uid": UID_C, "container": CID_C[:13]}  # unknown to the runtime: no name, never a UID in pod
    assert m["gpuzombie_scan_success"] == {(): 1.0}
    assert m["gpuzombie_zombies"] == {pod(**nofix): 1.0}
    assert m["gpuzombie_zombies_by_parent"] == {pod(**nofix, parent="sleep", parent_is_pid1="true"): 1.0}
    shared = {"namespace": "training", "name": "shared-pidns", "uid": UID_D}  # the pod, no one container
    assert m["gpuzombie_orphans"] == {pod(**nofix, verdict="orphan"): 1.0, pod(**shared, verdict="orphan"): 1.0}
    # PID 1 named only where it does not reap and holds a GPU (or has a zombie or orphan); every kind counted.
    assert m["gpuzombie_pid1_info"] == {pod(**nofix, program="sleep", kind="non_forking", reaping="false"): 1.0}
    assert m["gpuzombie_pid1_kinds"] == {
        labels(kind="pause", reaping="true"): 1.0,
        labels(kind="non_forking", reaping="false"): 1.0,
        labels(kind="init", reaping="true"): 2.0,
    }
    assert m["gpuzombie_orphans_cannot_tell"] == {(): 0.0}
    assert m["gpuzombie_gpu_process_memory_bytes"] == {
        pod(**nofix, gpu="0", UUID="GPU-0000", Hostname="gpu-node-1", verdict="live"): 2658 * MIB,
        pod(**tini, gpu="1", UUID="GPU-1111", Hostname="gpu-node-1", verdict="live"): 2000 * MIB,
        pod(**fullfix, gpu="1", UUID="GPU-1111", Hostname="gpu-node-1", verdict="live"): 1000 * MIB,
    }
    assert (
        m["gpuzombie_gpu_processes"][pod(**tini, gpu="1", UUID="GPU-1111", Hostname="gpu-node-1", verdict="live")] == 1
    )
    assert m["gpuzombie_fd_only_holders"] == {pod(gpu="0"): 1.0}  # the host's bash
    # The grace risk: scenario 1 (sleep drops SIGTERM) and 2 (tini's child ignores it), not 4.
    assert m["gpuzombie_grace_risk_gpu_memory_bytes"] == {
        pod(**nofix, reason="pid1_drops_sigterm"): 2658 * MIB,
        pod(**tini, reason="main_ignores_sigterm"): 2000 * MIB,
    }
    gpu0 = {"gpu": "0", "UUID": "GPU-0000", "Hostname": "gpu-node-1"}  # dcgm-exporter's label names
    assert m["gpuzombie_gpu_unexplained_memory_bytes"][labels(**gpu0)] == 1000 * MIB
    assert m["gpuzombie_gpu_memory_verdict"][labels(**gpu0, verdict="ghost")] == 1
    assert labels(**gpu0, verdict="ok") not in m["gpuzombie_gpu_memory_verdict"]  # one series a GPU
    assert m["gpuzombie_gpu_baseline_bytes"] == {
        labels(**gpu0, source="driver_reserved"): 615 * MIB,
        labels(gpu="1", UUID="GPU-1111", Hostname="gpu-node-1", source="driver_reserved"): 615 * MIB,
    }
    assert m["gpuzombie_gpu_memory_used_bytes"][labels(**gpu0)] == (615 + 2658 + 1000) * MIB
    assert m["gpuzombie_nvml_available"] == {(): 1.0}
    assert m["gpuzombie_pid_namespaces"] == {(): 4.0}  # the bare sandbox is skipped
    assert m["gpuzombie_scan_duration_seconds"][()] > 0


def test_min_interval_caches_the_scan(served, node):
    url, _collector = served
    for _ in range(3):
        assert scrape(url)["gpuzombie_scans_total"] == {(): 1.0}
    clock = [0.0]
    counted = NodeCollector(lambda: fake_scan(node), min_interval=5, clock=lambda: clock[0])
    for t, scans in ((0, 1), (4.9, 1), (5.0, 2), (6, 2), (10.1, 3)):
        clock[0] = t
        list(counted.collect())
        assert counted.scans == scans, t


def test_failed_scan_is_a_metric_not_a_500():
    def broken():
        raise FileNotFoundError(2, "No such file or directory", "/host/proc")

    registry = CollectorRegistry()
    registry.register(NodeCollector(broken, min_interval=0))
    exporter = PrometheusExporter(registry, listen=parse_listen("127.0.0.1:0"))
    port = exporter.start().port
    try:
        m = scrape(f"http://127.0.0.1:{port}/metrics")
        m = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        exporter.stop()
    assert m["gpuzombie_scan_success"] == {(): 0.0}
    assert m["gpuzombie_scan_errors_total"] == {(): 2.0} and "gpuzombie_zombies" not in m


def test_build_info_names_the_running_version_whatever_the_scan_did(served):
    """Issue 35 (9): no series said which version a node runs, so a rollout could not be followed.
    gpuzombie_build_info is 1 with the package's version, on a good scan and on a failed one, and
    the real promtool's linter passes the whole exposition."""

    def broken():
        raise FileNotFoundError(2, "No such file or directory", "/host/proc")

    expected = {labels(version=gpuzombie.__version__, python_version=platform.python_version()): 1.0}
    url, _ = served
    assert scrape(url)["gpuzombie_build_info"] == expected
    registry = CollectorRegistry()
    registry.register(NodeCollector(broken, min_interval=0))
    exporter = PrometheusExporter(registry, listen=parse_listen("127.0.0.1:0"))
    port = exporter.start().port
    try:
        assert scrape(f"http://127.0.0.1:{port}/metrics")["gpuzombie_build_info"] == expected
    finally:
        exporter.stop()
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read()
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_once_prints_the_exposition(node, tmp_path, capsys):
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(gpus())))
    absent = tmp_path / "absent.sock"
    assert (
        main(
            [
                "exporter",
                "--once",
                "--procfs",
                str(node),
                "--nvml-replay",
                str(replay),
                "--cri-socket",
                str(absent),
                "--node-name",
                "n1",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert re.search(r'^gpuzombie_zombies_by_parent\{.*parent="sleep".*\} 1\.0$', out.out, re.MULTILINE)
    assert 'gpuzombie_gpu_memory_verdict{Hostname="n1",UUID="GPU-0000",gpu="0",verdict="ghost"} 1.0' in out.out
    assert out.err.count(f"CRI socket {absent}: No such file or directory") == 1  # warnings go to stderr, once


def test_sigterm_disposition():
    d = parse_sigterm("Name:\ttini\nSigBlk:\tfffffffe7ffbfeff\nSigIgn:\t0000000000000000\nSigCgt:\t0\n")
    assert (d.blocked, d.ignored, d.caught, d.received_as_init) == (True, False, False, True)
    assert parse_sigterm("SigBlk:\t0\nSigIgn:\t4000\nSigCgt:\t4000\n").received_as_init is False
    assert parse_sigterm("Name:\tx\n").received_as_init is None  # unknown: never claimed a risk
    # tini in sigtimedwait: the kernel shows SIGTERM unblocked while it waits for it (measured).
    waiting = parse_sigterm("SigBlk:\t0\nSigIgn:\t300006\nSigCgt:\t0\n", "do_sigtimedwait.isra.0")
    assert waiting.received_as_init is True


@pytest.mark.parametrize(
    "listen, message",
    [
        ("nonsense", "is not HOST:PORT"),
        ("127.0.0.1:99999", "port must be a number"),
        ("::1:9400", "IPv6 address in brackets"),
    ],
)
def test_bad_listen_is_one_line_exit_2(listen, message, node, capsys):
    assert main(["exporter", "--listen", listen, "--procfs", str(node)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_port_in_use_is_one_line_exit_2(node, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["exporter", "--listen", f"127.0.0.1:{port}", "--procfs", str(node)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err and err.count("\n") == 1


def survey_live_proc():
    """Every PID namespace of this machine, judged from one read of the host's /proc."""
    procfs = Procfs("/proc")
    return survey(procfs, procfs.snapshot(now=0), now=0).namespaces


@needs_root
def test_real_zombie_and_orphan_in_a_pid_namespace():
    # PID 1 becomes `sleep` (never waits): its shell's background job exits into a zombie, and a
    # subshell's job is re-parented to it (an orphan).
    with PidNamespace("sh", "-c", "sleep 0.05 & (sleep 1000 &); exec sleep 1000") as ns:
        inode = os.stat(f"/proc/{ns.pid1}/ns/pid").st_ino

        def judged():
            found = [n for n in survey_live_proc() if n.inode == inode]
            # The subshell's exit re-parents its job a moment after the zombie appears: wait for both.
            ready = found and found[0].zombies and found[0].orphans and found[0].pid1.program == "sleep"
            return found if ready else None

        (mine,) = wait_until(judged, timeout=10)
        assert [(z.parent_comm, z.ppid) for z in mine.zombies] == [("sleep", 1)]
        assert [(o.comm, o.verdict) for o in mine.orphans] == [("sleep", "orphan")]
        assert mine.grace_risk == "pid1_drops_sigterm"

        exporter = subprocess.Popen(
            [sys.executable, "-m", "gpuzombie", "exporter", "--listen", "127.0.0.1:0", "--min-interval", "0"],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = exporter.stderr.readline()
            port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", first).group(1))
            m = scrape(f"http://127.0.0.1:{port}/metrics")
            assert m["gpuzombie_zombies_by_parent"][pod(parent="sleep", parent_is_pid1="true")] >= 1
            assert m["gpuzombie_orphans"][pod(verdict="orphan")] >= 1
            assert m["gpuzombie_zombies"][pod()] >= 1
            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(timeout=10) == 0
            assert "stopped (SIGTERM)" in exporter.stderr.read()
        finally:
            exporter.kill()
            exporter.wait()


@needs_root
@needs_tini
def test_real_tini_with_a_sigterm_ignoring_child():
    # tini forwards SIGTERM to its child, which ignores it (inherited SIG_IGN): the whole grace.
    # tini waits in sigtimedwait, where /proc shows SIGTERM unblocked: it must not read as dropped.
    with PidNamespace("tini", "--", "sh", "-c", "trap '' TERM; exec sleep 1000") as ns:
        inode = os.stat(f"/proc/{ns.pid1}/ns/pid").st_ino

        def judged():
            found = [n for n in survey_live_proc() if n.inode == inode]
            # tini settles in sigtimedwait after starting its child: judge it there, not mid-start.
            settled = found and found[0].main and found[0].main.comm == "sleep" and found[0].pid1_sigterm.sigwaiting
            return found if settled else None

        (mine,) = wait_until(judged, timeout=10)
        assert mine.pid1.program == "tini" and mine.pid1_sigterm.received_as_init
        assert mine.main.sigterm.ignored and mine.grace_risk == "main_ignores_sigterm"


def test_docs_list_every_metric(served):
    """docs/exporter.md's metric table (and docs/cluster.md for the serving side) is the reference: every name the exporter serves is in it."""
    url, _ = served
    served_names = {re.sub(r"_total$", "", name) for name in scrape(url)} | set(GAUGES)
    documented = set(re.findall(r"`(gpuzombie_[a-z0-9_]+?)(?:_total)?`", doc("exporter") + doc("cluster")))
    assert served_names <= documented, served_names - documented


def test_documented_commands_use_real_flags(capsys):
    commands = re.findall(r"^(?:\.venv/bin/)?gpuzombie exporter([^#\n]*)", doc("exporter"), re.MULTILINE)
    assert len(commands) >= 3
    assert main(["exporter", "--help"]) == 0
    help_text = capsys.readouterr().out
    for flags in commands:
        for flag in re.findall(r"--[a-z-]+", flags):
            assert flag in help_text, flag


def test_once_on_an_unreadable_tree_is_one_line_exit_2(tmp_path, capsys):
    empty = tmp_path / "proc"
    empty.mkdir()  # no /proc/stat: the scan itself fails
    assert main(["exporter", "--once", "--procfs", str(empty)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"gpuzombie: error: {empty} is not a procfs (no stat file")
    assert out.err.count("\n") == 1
