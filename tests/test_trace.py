"""The whole node mapping end to end: a fake /proc tree, a fake NVML, a stand-in CRI runtime (a real
gRPC server: no containerd made these container ids; tests/test_cri_containerd.py runs a real one),
and a real gRPC server on the kubelet's PodResources socket."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


from cri_standin import Recorded, standin_kubelet, standin_runtime
from docs import doc
from fakeproc import make_fake_proc, make_fake_root
from gpufakes import gpu_device, gpu_process, gpu_snapshot
from gpuzombie.cli.main import main
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot
from gpuzombie.k8s.names import RuntimeNames
from gpuzombie.k8s.podresources import PodResources, list_pod_resources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.trace.model import trace_node
from gpuzombie.trace.render import render_text
from gpuzombie.units import MIB

CID_A = "a" * 64
CID_B = "b" * 64
CID_C = "c" * 64
SANDBOX_A = "5" * 64
UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "66666666-7777-8888-9999-000000000000"
UID_C = "12345678-1234-1234-1234-123456789abc"


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
    return gpu_snapshot(
        gpu_device(0, uuid="GPU-0000", used=(615 + 2658 + 291) * MIB, processes=[gpu_process(200)]),
        gpu_device(1, uuid="GPU-1111", processes=[gpu_process(300, mib=3000), gpu_process(999, mib=500)]),
        driver_version="580.159.04",
    )


RECORDED = Recorded(
    listed={CID_A: ("worker", "gpu-zombie-nofix", "gpu-zombie-test", UID_A)},
    sandboxes=(
        (SANDBOX_A, "gpu-zombie-nofix", "gpu-zombie-test", UID_A),
        ("9" * 64, "nccl-rank1", "training", UID_B),
    ),
    # Only found by ContainerStatus (say, listed by neither call in time): the fallback path.
    status_only={CID_B: ("rank", "nccl-rank1", "training", UID_B)},
)


@pytest.fixture
def cri_calls(tmp_path):
    """The stand-in runtime on tmp/cri.sock; the test gets its call log."""
    with standin_runtime(str(tmp_path / "cri.sock"), RECORDED) as calls:
        yield calls


@pytest.fixture
def crisock(tmp_path, cri_calls):
    return tmp_path / "cri.sock"


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    build_node(root)
    return root


NO_RESOURCES = PodResources(source=None)


def run_trace(node, crisock, resources=NO_RESOURCES, timeout=5.0):
    return trace_node(
        procfs=Procfs(str(node)),
        nvml=FakeNvml(gpus()),
        view=ReaderView(in_root_pidns=True),
        names=RuntimeNames(str(crisock), timeout=timeout),
        resources=resources,
        now=time.time(),
    )


def by_pid(report):
    out = {}
    for row in report.rows:
        out.setdefault(row.pid, []).append(row)
    return out


def test_node_mapping_end_to_end(node, crisock, cri_calls):
    report = run_trace(node, crisock)
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
    # Two calls for the node and ContainerStatus for the ids they did not list: never one per container.
    assert cri_calls == ["ListPodSandbox", "ListContainers", f"ContainerStatus {CID_B}", f"ContainerStatus {CID_C}"]

    text = render_text(report)
    header = text.splitlines()[0].split()
    assert header == ["PID", "NSPID", "STATE", "GPU", "GPU_MEM", "NSMI", "QOS", "POD", "NAMESPACE", "CONTAINER"]
    assert any(
        line.split()[:10]
        == ["200", "7", "S", "0", "2658", "MiB", "Y", "burstable", "gpu-zombie-nofix", "gpu-zombie-test"]
        for line in text.splitlines()
    )
    assert "[GHOST]" in text and "615 MiB" in text


def test_id_unknown_to_the_runtime_keeps_the_other_names(node, crisock):
    # CID_C is unknown to the runtime (NOT_FOUND): a warning names it, the others keep their names.
    report = run_trace(node, crisock)
    assert by_pid(report)[300][0].container == "rank"
    assert any("1 container(s) unknown" in w and CID_C[:13] in w for w in report.warnings)


def test_runtime_that_never_answers_is_bounded(node, tmp_path):
    with socket.socket(socket.AF_UNIX) as silent:  # accepts connections, never says a word
        silent.bind(str(tmp_path / "silent.sock"))
        silent.listen(8)
        t0 = time.monotonic()
        report = run_trace(node, tmp_path / "silent.sock", timeout=0.5)
        assert time.monotonic() - t0 < 3
    (warning,) = [w for w in report.warnings if "CRI" in w]
    assert "no answer in time" in warning and warning.endswith("pods and containers shown by id")
    worker = by_pid(report)[200][0]
    assert (worker.pod, worker.pod_uid, worker.container_id) == (None, UID_A, CID_A)


def test_absent_runtime_gives_ids_and_one_warning(node, tmp_path):
    report = run_trace(node, tmp_path / "absent.sock")
    (warning,) = [w for w in report.warnings if "CRI" in w]
    assert warning == f"CRI socket {tmp_path}/absent.sock: No such file or directory: pods and containers shown by id"
    assert report.sources.cri_socket == str(tmp_path / "absent.sock")
    assert "11111111-2222-3333-4444-555555555555" in render_text(report)


def test_no_runtime_socket_at_the_usual_places(node, tmp_path):
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=FakeNvml(gpus()),
        view=ReaderView(in_root_pidns=True),
        names=RuntimeNames(None, candidates=(str(tmp_path / "containerd.sock"),)),
        resources=PodResources(source=None),
        now=time.time(),
    )
    assert report.sources.cri_socket is None and report.warnings[0].startswith("no CRI socket (")
    assert by_pid(report)[200][0].container_id == CID_A


class BrokenNvml:
    """A binding that raises what no one foresaw (a driver bug): not the PynvmlBackend's handled errors."""

    def read(self) -> GpuSnapshot:
        raise RuntimeError("driver returned garbage")


def test_broken_nvml_keeps_the_process_rows(node, crisock):
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=BrokenNvml(),
        view=ReaderView(in_root_pidns=True),
        names=RuntimeNames(str(crisock)),
        resources=NO_RESOURCES,
        now=time.time(),
    )
    assert not report.gpu.available and "RuntimeError: driver returned garbage" in report.gpu.reason
    assert any(w.startswith("GPU: NVML failed") for w in report.warnings)
    assert by_pid(report)[200][0].container_id == CID_A


@pytest.fixture
def kubelet_socket(tmp_path):
    sock = tmp_path / "kubelet.sock"
    with standin_kubelet(str(sock), {("gpu-zombie-test", "gpu-zombie-nofix"): {"worker": ("GPU-0000",)}}):
        yield sock


def test_pod_resources_from_a_real_grpc_server(node, crisock, kubelet_socket):
    resources = list_pod_resources(str(kubelet_socket), timeout=5)
    assert resources.warning is None
    assert [(a.namespace, a.pod, a.container, a.resource, a.device_id) for a in resources.assignments] == [
        ("gpu-zombie-test", "gpu-zombie-nofix", "worker", "nvidia.com/gpu", "GPU-0000")
    ]
    report = run_trace(node, crisock, resources=resources)
    gpu0 = report.gpus[0]
    assert [(a.namespace, a.pod, a.container) for a in gpu0.allocated_to] == [
        ("gpu-zombie-test", "gpu-zombie-nofix", "worker")
    ]
    assert report.sources.pod_resources == str(kubelet_socket)


def test_cli_json_and_exit_codes(node, crisock, tmp_path, capsys):
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(gpus())))
    argv = [
        "trace",
        "--procfs",
        str(node),
        "--cri-socket",
        str(crisock),
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
    idle = gpu_snapshot(gpu_device(0))
    replay.write_text(json.dumps(dataclasses.asdict(idle)))
    assert main(["trace", "--procfs", str(root), "--nvml-replay", str(replay)]) == 0
    out = capsys.readouterr().out
    assert "unexplained 0 MiB  [ok]" in out and "615 MiB per GPU" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["trace", "--procfs", "/nonexistent"], "not a directory"),
        (["trace", "--cri-timeout", "0"], "cri-timeout"),
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
    assert err.startswith(f"gpuzombie: error: {tmp_path} is not a procfs") and len(err.splitlines()) == 1


def test_cli_procfs_without_boot_time(tmp_path, capsys):
    # A stat file with no btime line: a usage error about the tree, not an internal error.
    (tmp_path / "stat").write_text("cpu 0 0 0 0\n")
    assert main(["trace", "--procfs", str(tmp_path), "--pod-resources-socket", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpuzombie: error: cannot read {tmp_path}: no btime line in /proc/stat"


def test_readme_example_is_this_nodes_table(node, crisock):
    """docs/trace.md's example output is what trace prints for this test's node (tested documentation)."""
    section = doc("trace")
    example = section[section.index("```\nPID") + 4 : section.index("\n```", section.index("```\nPID") + 4)]
    assert example == render_text(run_trace(node, crisock))


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


def test_library_users_get_the_trace_json_without_the_cli(node, crisock):
    """One serializer: the library's ``dumps`` gives the documented schema, MiB rendered from bytes."""
    from gpuzombie.jsonout import dumps

    doc = json.loads(dumps(run_trace(node, crisock)))
    assert doc["schema"] == "gpuzombie.trace/1"
    worker = next(r for r in doc["rows"] if r["pid"] == 200)
    assert worker["gpu_memory_mib"] == 2658.0 and "gpu_memory" not in worker
    assert (doc["gpus"][0]["baseline_mib"], doc["gpus"][0]["unexplained_mib"]) == (615.0, 291.0)
