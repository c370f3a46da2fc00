"""The whole node mapping end to end: a fake /proc tree, a fake NVML, a real stand-in crictl
executable, and a real gRPC server on the kubelet's PodResources socket."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from docs import doc
from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.cli.main import main
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import MIB, FakeNvml, GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.k8s import cri
from gpuzombie.k8s.podresources import PodResources, list_pod_resources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.trace.render import render_text
from gpuzombie.trace.report import trace_node

CID_A = "a" * 64
CID_B = "b" * 64
CID_C = "c" * 64
SANDBOX_A = "5" * 64
UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "66666666-7777-8888-9999-000000000000"
UID_C = "12345678-1234-1234-1234-123456789abc"
GIB = 1024 * MIB


def cgroup_a(cid=CID_A):
    u = UID_A.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope\n"


def build_node(root: Path) -> None:
    """A node: a host daemon, a worker, its zombie sibling, an NCCL rank, an unlisted holder."""
    make_fake_root(root)

    def proc(pid, cgroup, **kw):
        d = make_fake_proc(root, pid, **kw)
        (d / "cgroup").write_text(cgroup)

    proc(1, "0::/init.scope\n", ppid=0, comm="systemd", cmdline=b"/sbin/init\0")
    proc(
        100,
        "0::/system.slice/nvidia-persistenced.service\n",
        ppid=1,
        comm="nvidia-persiste",
        fds=("/dev/nvidiactl", "/dev/null"),
    )
    proc(
        200,
        cgroup_a(),
        ppid=1,
        nspid=(200, 7),
        comm="python3",
        fds=("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"),
    )
    proc(201, cgroup_a(), ppid=1, nspid=(201, 8), state="Z", comm="python3", cmdline=b"")
    proc(202, cgroup_a(SANDBOX_A), ppid=1, nspid=(202, 1), comm="pause")
    proc(
        300,
        f"0::/kubepods/pod{UID_B}/crio-{CID_B}\n",
        ppid=1,
        nspid=(300, 1),
        comm="python3",
        fds=("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"),
    )
    proc(
        400,
        f"0::/kubepods/besteffort/pod{UID_C}/{CID_C}\n",
        ppid=1,
        nspid=(400, 5),
        comm="python3",
        fds=("/dev/nvidia1",),
    )
    proc(500, "0::/user.slice/user-0.slice/session-1.scope\n", ppid=1, comm="bash", cmdline=b"bash\0")


def gpus() -> GpuSnapshot:
    # GPU0: the worker (2658 MiB) + 291 MiB left by the NCCL rank's peer context, over the 615 MiB
    # driver reservation. GPU1: the rank, and a pid that no longer exists.
    return GpuSnapshot(
        available=True,
        driver_version="580.159.04",
        devices=(
            GpuDevice(
                0,
                "GPU-0000",
                "NVIDIA H200",
                140 * GIB,
                (615 + 2658 + 291) * MIB,
                0,
                615 * MIB,
                (GpuProcess(200, 2658 * MIB, "compute", "python3"),),
            ),
            GpuDevice(
                1,
                "GPU-1111",
                "NVIDIA H200",
                140 * GIB,
                (615 + 3000 + 500) * MIB,
                0,
                615 * MIB,
                (GpuProcess(300, 3000 * MIB, "compute", "python3"), GpuProcess(999, 500 * MIB, "compute", "python3")),
            ),
        ),
    )


def crictl_data() -> dict:
    def labels(pod, ns, uid, container):
        return {
            "io.kubernetes.pod.name": pod,
            "io.kubernetes.pod.namespace": ns,
            "io.kubernetes.pod.uid": uid,
            "io.kubernetes.container.name": container,
        }

    return {
        "ps": {
            "containers": [
                {
                    "id": CID_A,
                    "metadata": {"name": "worker"},
                    "state": "CONTAINER_RUNNING",
                    "labels": labels("gpu-zombie-nofix", "gpu-zombie-test", UID_A, "worker"),
                },
            ]
        },
        "pods": {
            "items": [
                {
                    "id": SANDBOX_A,
                    "state": "SANDBOX_READY",
                    "metadata": {"name": "gpu-zombie-nofix", "uid": UID_A, "namespace": "gpu-zombie-test"},
                },
                {
                    "id": "9" * 64,
                    "state": "SANDBOX_READY",
                    "metadata": {"name": "nccl-rank1", "uid": UID_B, "namespace": "training"},
                },
            ]
        },
        # Only found by "inspect" (say, listed by neither call in time): the fallback path.
        "inspect": {
            CID_B: {
                "status": {
                    "id": CID_B,
                    "metadata": {"name": "rank"},
                    "state": "CONTAINER_RUNNING",
                    "labels": labels("nccl-rank1", "training", UID_B, "rank"),
                }
            }
        },
    }


CRICTL = """#!{python}
import json, os, sys, time
data = json.load(open({data!r}))
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(" ".join(args) + "\\n")
mode = os.environ.get("FAKE_CRICTL_MODE", "")
if mode == "hang":
    os.system("sleep 30")
if mode == "fail":
    sys.stderr.write("connect: connect endpoint 'unix:///run/containerd/containerd.sock': no such file\\n")
    sys.exit(1)
if args[0] == "inspect":
    for cid in args[3:]:
        if cid not in data["inspect"]:
            sys.stderr.write("no such container " + cid + "\\n")
            sys.exit(1)
        print(json.dumps(data["inspect"][cid], indent=2))
else:
    print(json.dumps(data[args[0]]))
"""


@pytest.fixture
def crictl(tmp_path):
    data = tmp_path / "crictl.json"
    data.write_text(json.dumps(crictl_data()))
    exe = tmp_path / "crictl"
    exe.write_text(CRICTL.format(python=sys.executable, data=str(data), log=str(tmp_path / "crictl.log")))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    build_node(root)
    return root


NO_RESOURCES = PodResources(source=None)


def run_trace(node, crictl, resources=NO_RESOURCES, timeout=5.0):
    return trace_node(
        procfs=Procfs(str(node)),
        nvml=FakeNvml(gpus()),
        view=ReaderView(in_root_pidns=True),
        names=lambda ids: cri.lookup(str(crictl), ids, timeout=timeout),
        resources=resources,
        now=time.time(),
    )


def by_pid(report):
    out = {}
    for row in report.rows:
        out.setdefault(row.pid, []).append(row)
    return out


def test_node_mapping_end_to_end(node, crictl, tmp_path):
    report = run_trace(node, crictl)
    rows = by_pid(report)
    worker = rows[200][0]
    assert (worker.nspid, worker.gpu_index, worker.gpu_memory, worker.nsmi, worker.verdict) == (
        7,
        0,
        2658 * MIB,
        True,
        "live",
    )
    assert (worker.qos, worker.pod, worker.namespace, worker.container) == (
        "burstable",
        "gpu-zombie-nofix",
        "gpu-zombie-test",
        "worker",
    )
    assert (worker.runtime, worker.cgroup_driver, worker.cgroup_version) == ("containerd", "systemd", "v2")
    zombie = rows[201][0]
    assert (zombie.state, zombie.verdict, zombie.pod, zombie.container) == ("Z", "zombie", "gpu-zombie-nofix", "worker")
    rank = rows[300][0]
    assert (rank.gpu_index, rank.qos, rank.pod, rank.namespace, rank.container, rank.runtime) == (
        1,
        "guaranteed",
        "nccl-rank1",
        "training",
        "rank",
        "cri-o",
    )
    unlisted = rows[400][0]
    assert (unlisted.nsmi, unlisted.verdict, unlisted.gpu_index, unlisted.qos) == (False, "fd-only", 1, "besteffort")
    assert (unlisted.pod, unlisted.pod_uid, unlisted.container) == (None, UID_C, None)  # unknown: ids
    host = rows[100][0]
    assert (host.verdict, host.pod, host.container_id) == ("fd-only", None, None)
    gone = rows[999][0]
    assert (gone.state, gone.verdict, gone.gpu_index, gone.nsmi) == ("-", "gone", 1, True)
    assert 500 not in rows and 202 not in rows and 1 not in rows  # not GPU-related, not zombies

    gpu0, gpu1 = report.gpus
    assert (gpu0.baseline, gpu0.unexplained, gpu0.verdict) == (615 * MIB, 291 * MIB, "ghost")
    assert "pid 300 (pod training/nccl-rank1), listed on GPU 1, also holds /dev/nvidia0" in gpu0.likely_causes[0]
    assert gpu1.unexplained == 0 and gpu1.verdict == "ok"
    s = report.summary
    assert (s.zombies, s.gone, s.ghost_gpus, s.fd_only, s.gpu_processes, s.healthy) == (1, 1, 1, 2, 3, False)
    # Two calls for the node and one inspect for the id they did not name: never one per container.
    calls = (tmp_path / "crictl.log").read_text().splitlines()
    assert calls == [
        "ps -a -o json",
        "pods -o json",
        f"inspect -o json {CID_B} {CID_C}",
        f"inspect -o json {CID_B}",
        f"inspect -o json {CID_C}",
    ]

    text = render_text(report)
    header = text.splitlines()[0].split()
    assert header == ["PID", "NSPID", "STATE", "GPU", "GPU_MEM", "NSMI", "QOS", "POD", "NAMESPACE", "CONTAINER"]
    assert any(
        line.split()[:10]
        == ["200", "7", "S", "0", "2658", "MiB", "Y", "burstable", "gpu-zombie-nofix", "gpu-zombie-test"]
        for line in text.splitlines()
    )
    assert "[GHOST]" in text and "615 MiB" in text


def test_id_unknown_to_the_runtime_keeps_the_other_names(node, crictl):
    # CID_C is unknown to the runtime (crictl fails the batch): each id alone, a warning names it.
    report = run_trace(node, crictl)
    assert by_pid(report)[300][0].container == "rank"
    assert any("1 container(s) unknown" in w and CID_C[:13] in w for w in report.warnings)


def test_hanging_crictl_is_bounded(node, crictl, monkeypatch):
    monkeypatch.setenv("FAKE_CRICTL_MODE", "hang")
    t0 = time.monotonic()
    report = run_trace(node, crictl, timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert any("timed out" in w for w in report.warnings)
    worker = by_pid(report)[200][0]
    assert (worker.pod, worker.pod_uid, worker.container_id) == (None, UID_A, CID_A)


def test_failing_crictl_gives_ids_and_one_warning(node, crictl, monkeypatch):
    monkeypatch.setenv("FAKE_CRICTL_MODE", "fail")
    report = run_trace(node, crictl)
    assert next(w for w in report.warnings if "crictl" in w).startswith("crictl: 'ps -a' exited 1: connect:")
    assert "11111111-2222-3333-4444-555555555555" in render_text(report)


def test_no_crictl(node, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=FakeNvml(gpus()),
        view=ReaderView(in_root_pidns=True),
        names=lambda ids: cri.lookup(None, ids),
        resources=PodResources(source=None),
        now=time.time(),
    )
    assert report.sources.crictl is None and "crictl not found" in report.warnings[0]
    assert by_pid(report)[200][0].container_id == CID_A


class BrokenNvml:
    """A binding that raises what no one foresaw (a driver bug): not the PynvmlBackend's handled errors."""

    def read(self) -> GpuSnapshot:
        raise RuntimeError("driver returned garbage")


def test_broken_nvml_keeps_the_process_rows(node, crictl):
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=BrokenNvml(),
        view=ReaderView(in_root_pidns=True),
        names=lambda ids: cri.lookup(str(crictl), ids),
        resources=NO_RESOURCES,
        now=time.time(),
    )
    assert not report.gpu.available and "RuntimeError: driver returned garbage" in report.gpu.reason
    assert any(w.startswith("GPU: NVML failed") for w in report.warnings)
    assert by_pid(report)[200][0].container_id == CID_A


def _pod_resources_message() -> bytes:
    def field(num, payload):
        payload = payload.encode() if isinstance(payload, str) else payload
        return bytes([num << 3 | 2, len(payload)]) + payload

    devices = field(1, "nvidia.com/gpu") + field(2, "GPU-0000")
    container = field(1, "worker") + field(2, devices) + bytes([3 << 3, 5])  # + cpu_ids: skipped
    return field(1, field(1, "gpu-zombie-nofix") + field(2, "gpu-zombie-test") + field(3, container))


@pytest.fixture
def kubelet_socket(tmp_path):
    grpc = pytest.importorskip("grpc", reason="grpcio (test extra) runs the stand-in kubelet")
    from concurrent import futures

    sock = tmp_path / "kubelet.sock"
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {"List": grpc.unary_unary_rpc_method_handler(lambda req, ctx: _pod_resources_message())},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield sock
    server.stop(0)


def test_pod_resources_from_a_real_grpc_server(node, crictl, kubelet_socket):
    resources = list_pod_resources(str(kubelet_socket), timeout=5)
    assert resources.warning is None
    assert [(a.namespace, a.pod, a.container, a.resource, a.device_id) for a in resources.assignments] == [
        ("gpu-zombie-test", "gpu-zombie-nofix", "worker", "nvidia.com/gpu", "GPU-0000")
    ]
    report = run_trace(node, crictl, resources=resources)
    gpu0 = report.gpus[0]
    assert [(a.namespace, a.pod, a.container) for a in gpu0.allocated_to] == [
        ("gpu-zombie-test", "gpu-zombie-nofix", "worker")
    ]
    assert report.sources.pod_resources == str(kubelet_socket)


def test_pod_resources_unimplemented_or_absent(tmp_path):
    grpc = pytest.importorskip("grpc", reason="grpcio (test extra) runs the stand-in kubelet")
    from concurrent import futures

    assert list_pod_resources(str(tmp_path / "none.sock")) == PodResources(source=None)
    sock = tmp_path / "k.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # no service: UNIMPLEMENTED
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        got = list_pod_resources(str(sock), timeout=5)
    finally:
        server.stop(0)
    assert got.assignments == () and "error status" in got.warning


def test_cli_json_and_exit_codes(node, crictl, tmp_path, capsys):
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(gpus())))
    argv = [
        "trace",
        "--procfs",
        str(node),
        "--crictl",
        str(crictl),
        "--nvml-replay",
        str(replay),
        "--pod-resources-socket",
        str(tmp_path / "absent.sock"),
    ]
    assert main([*argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuzombie.trace/1"
    assert {r["pid"]: r["pod"] for r in doc["rows"]}[200] == "gpu-zombie-nofix"
    assert doc["gpus"][0]["verdict"] == "ghost" and doc["summary"]["healthy"] is False
    assert main(argv) == 1
    assert "gpu-zombie-nofix" in capsys.readouterr().out


def test_cli_healthy_node_exits_0(tmp_path, capsys):
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd")
    replay = tmp_path / "nvml.json"
    idle = GpuSnapshot(
        available=True, devices=(GpuDevice(0, "GPU-0", "NVIDIA H200", 140 * GIB, 615 * MIB, 0, 615 * MIB),)
    )
    replay.write_text(json.dumps(dataclasses.asdict(idle)))
    assert main(["trace", "--procfs", str(root), "--nvml-replay", str(replay)]) == 0
    out = capsys.readouterr().out
    assert "unexplained 0 MiB  [ok]" in out and "615 MiB per GPU" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["trace", "--procfs", "/nonexistent"], "not a directory"),
        (["trace", "--crictl", "/nonexistent/crictl"], "not an executable"),
        (["trace", "--crictl-timeout", "0"], "crictl-timeout"),
    ],
)
def test_cli_bad_input_is_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_cli_procfs_that_is_no_procfs(tmp_path, capsys):
    # An empty directory (no /proc/stat): one line naming the tree, exit 2.
    assert main(["trace", "--procfs", str(tmp_path), "--pod-resources-socket", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpuzombie: error: cannot read {tmp_path}") and len(err.splitlines()) == 1


def test_cli_procfs_without_boot_time(tmp_path, capsys):
    # A stat file with no btime line: a usage error about the tree, not an internal error.
    (tmp_path / "stat").write_text("cpu 0 0 0 0\n")
    assert main(["trace", "--procfs", str(tmp_path), "--pod-resources-socket", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpuzombie: error: cannot read {tmp_path}: no btime line in /proc/stat"


def test_readme_example_is_this_nodes_table(node, crictl):
    """docs/trace.md's example output is what trace prints for this test's node (tested documentation)."""
    section = doc("trace")
    example = section[section.index("```\nPID") + 4 : section.index("\n```", section.index("```\nPID") + 4)]
    assert example == render_text(run_trace(node, crictl))


def test_scan_of_the_real_proc_finds_a_zombie_and_a_device_holder(tmp_path):
    """The candidate scan on the live /proc: a real unreaped child, a real holder of a stand-in
    device node, and nothing of the many other processes of this machine."""
    import subprocess

    device = tmp_path / "nvidia0"
    device.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(device)!r}); import time; time.sleep(30)"])
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        found: list[int] = []
        while time.monotonic() < deadline:
            procfs = Procfs("/proc", device_prefix=str(tmp_path / "nvidia"))
            found, _ = procfs.relevant_pids([], skip=os.getpid())
            if holder.pid in found and zombie.pid in found:
                break
            time.sleep(0.05)
        assert holder.pid in found and zombie.pid in found
        assert os.getpid() not in found
    finally:
        holder.kill()
        holder.wait()
        zombie.wait()


def test_cli_refuses_a_live_proc_without_root():
    """Without root, others' fds are unreadable: a one-line error, not a silently empty table.
    A forked child drops to uid 65534 for real and runs the already imported CLI."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            sys.stderr = os.fdopen(write_end, "w")  # pytest's capture replaced the object, not fd 2
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = main(["trace", "--pod-resources-socket", "/nonexistent"])
            sys.stderr.flush()
            os._exit(code)
        finally:
            os._exit(99)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 2, err
    assert err.strip() == "gpuzombie: error: trace reads every process's fds and cgroup: run it as root"
