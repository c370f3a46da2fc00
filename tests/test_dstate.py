"""D-state GPU holders: the tracker across exporter scans on fake procfs trees (first seen, kept,
anew when the process leaves D or its pid is reused), what counts as a holder, the series and the
names in trace and observe; and a real process in state D (tests/dstate.py: a posix_spawn parent
waiting on its vfork child) holding a stand-in /dev/nvidia0, found on the live /proc."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")


from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dstate import d_state_process
from fakeproc import make_fake_proc, make_fake_root
from gpufakes import gpu_device, gpu_process, gpu_snapshot
from gpuzombie.exporter import NodeCollector, scan_node
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.dstate import DStateTracker
from gpuzombie.gpu.nvml import FakeNvml, GpuProcess, GpuSnapshot
from gpuzombie.k8s.names import ContainerNames, CriNames
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.observe.model import observe
from gpuzombie.observe.render import render_text as render_observe
from gpuzombie.proc.procfs import Procfs
from gpuzombie.trace.model import trace_node
from gpuzombie.trace.render import render_text as render_trace
from gpuzombie.units import MIB

CID, UID = "f" * 64, "0d0d0d0d-1111-2222-3333-444444444444"
CGROUP = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"  # a pod's process
ROOT_VIEW = ReaderView(in_root_pidns=True)
T0 = 1_800_000_000.0


def names(ids) -> CriNames:
    found = {CID: ContainerNames(CID, "worker", "train-0", "ml", UID, "CONTAINER_RUNNING")} if CID in set(ids) else {}
    return CriNames(source="fake", containers=found)


def gpus(*processes: GpuProcess) -> GpuSnapshot:
    return gpu_snapshot(gpu_device(0, uuid="GPU-0000", processes=processes))


def process(root: Path, pid: int, *, state: str, starttime: int = 5000, fds=("/dev/nvidia0",), pod=True) -> None:
    """(Re)write one process of the fake tree: a pod's worker unless ``pod`` is False."""
    shutil.rmtree(root / str(pid), ignore_errors=True)
    d = make_fake_proc(root, pid, ppid=1, state=state, fds=fds, starttime=starttime)
    if pod:
        (d / "cgroup").write_text(CGROUP)


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0")
    return root


class Exporter:
    """One exporter process over a procfs tree: its D-state tracker on a monotonic clock the test
    sets (``at``: seconds since the exporter started), and the wall clock its scans are stamped with."""

    def __init__(self, root: Path) -> None:
        self.procfs = Procfs(str(root))
        self.monotonic = 0.0
        self.tracker = DStateTracker(clock=lambda: self.monotonic)

    def scan(self, at: float, nvml: GpuSnapshot | None = None, *, wall: float | None = None):
        self.monotonic = at
        return scan_node(
            procfs=self.procfs,
            nvml=FakeNvml(nvml or gpus()),
            view=ROOT_VIEW,
            names=names,
            resources=lambda: PodResources(source=None),
            now=T0 + at if wall is None else wall,
            node_name="gpu-node-1",
            dstate=self.tracker,
        )


def series(node_scan) -> dict[str, dict[tuple, float]]:
    registry = CollectorRegistry()
    registry.register(NodeCollector(lambda: node_scan, min_interval=60))
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("gpuzombie_dstate"):
                found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


def seconds(node_scan) -> dict[str, float]:
    """pod -> seconds its longest-stuck holder has been seen in D (one series a pod: no pid label)."""
    return {dict(k)["pod"]: v for k, v in series(node_scan).get("gpuzombie_dstate_seconds", {}).items()}


POD = {"namespace": "ml", "pod": "train-0", "pod_uid": UID, "container": "worker"}


def test_first_seen_is_kept_across_scans_and_named_by_pod(node):
    process(node, 500, state="D")
    exporter = Exporter(node)
    first = exporter.scan(0)
    assert seconds(first) == {"train-0": 0.0}
    later = series(exporter.scan(90))
    assert later["gpuzombie_dstate_seconds"] == {tuple(sorted(POD.items())): 90.0}
    assert later["gpuzombie_dstate_gpu_holders"] == {tuple(sorted(POD.items())): 1.0}
    assert seconds(exporter.scan(400)) == {"train-0": 400.0}


def test_leaving_d_starts_anew(node):
    process(node, 500, state="D")
    exporter = Exporter(node)
    exporter.scan(0)
    assert seconds(exporter.scan(60)) == {"train-0": 60.0}
    process(node, 500, state="S")
    gone = exporter.scan(120)
    assert seconds(gone) == {}
    assert series(gone) == {}  # no sample (the families keep HELP and TYPE)
    process(node, 500, state="D")
    assert seconds(exporter.scan(180)) == {"train-0": 0.0}
    assert seconds(exporter.scan(200)) == {"train-0": 20.0}


def test_a_reused_pid_is_another_process(node):
    process(node, 500, state="D", starttime=5000)
    exporter = Exporter(node)
    exporter.scan(0)
    assert seconds(exporter.scan(60)) == {"train-0": 60.0}
    process(node, 500, state="D", starttime=9000)  # the same pid, a later process: also in D
    assert seconds(exporter.scan(120)) == {"train-0": 0.0}


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_wall_clock_step_does_not_change_the_time_in_d(node, step):
    """Issue 29 item 5: scans 15 s apart on the monotonic clock while the wall clock steps an hour
    (NTP, ``date -s``). On 241ae16 the time in D was taken from the wall clock: 3,615 s after a +1 h
    step (a critical alert at once), 0 s after a -1 h one (clamped from -3,585). Now 15 s both ways."""
    process(node, 500, state="D")
    exporter = Exporter(node)
    exporter.scan(0, wall=T0)
    assert seconds(exporter.scan(15, wall=T0 + 15 + step)) == {"train-0": 15.0}


def test_only_gpu_holders_in_d_count(node):
    process(node, 500, state="D")  # holds /dev/nvidia0
    process(node, 501, state="D", fds=())  # NVML lists it with memory, no fd readable here
    process(node, 502, state="D", fds=())  # in D, but no GPU: an NFS read, not ours
    process(node, 503, state="S")  # holds the GPU, not in D
    process(node, 504, state="D", fds=("/dev/nvidiactl",), pod=False)  # a host process
    nvml = gpus(gpu_process(501, mib=3000), gpu_process(503, mib=1000))
    got = series(Exporter(node).scan(0, nvml))
    host = {"namespace": "", "pod": "", "pod_uid": "", "container": ""}
    assert got["gpuzombie_dstate_gpu_holders"] == {tuple(sorted(POD.items())): 2.0, tuple(sorted(host.items())): 1.0}
    assert got["gpuzombie_dstate_gpu_memory_bytes"][tuple(sorted(POD.items()))] == 3000 * MIB
    assert sorted(dict(k)["pod"] for k in got["gpuzombie_dstate_seconds"]) == ["", "train-0"]


def test_one_series_a_pod_the_longest_stuck(node):
    """Issue 28: a series a stuck process (pid and comm labels) never ends, and a pod whose
    processes keep entering D adds one each time. Now one series a pod: its longest-stuck holder."""
    process(node, 500, state="D")
    exporter = Exporter(node)
    exporter.scan(0)
    process(node, 501, state="D", fds=("/dev/nvidia0",))
    later = series(exporter.scan(90))
    assert later["gpuzombie_dstate_seconds"] == {tuple(sorted(POD.items())): 90.0}
    assert later["gpuzombie_dstate_gpu_holders"] == {tuple(sorted(POD.items())): 2.0}


def test_trace_and_observe_name_them(node):
    process(node, 500, state="D")
    process(node, 501, state="S")
    nvml = gpus(gpu_process(500))
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=FakeNvml(nvml),
        view=ROOT_VIEW,
        names=names,
        resources=PodResources(source=None),
        now=T0,
    )
    data = json.loads(json.dumps(report.to_dict()))
    assert [(h["pid"], h["gpus"], h["gpu_memory_mib"], h["devices"]) for h in data["d_state"]] == [
        (500, [0], 2658.0, ["/dev/nvidia0"])
    ]
    assert data["summary"]["d_state"] == 1 and data["summary"]["healthy"] is True  # named, not a finding
    text = render_trace(report)
    assert "D state: pid 500 (python3) in pod ml/train-0: 2658 MiB on GPU 0, holds /dev/nvidia0" in text
    assert "1 in D state" in text

    seen = observe(Procfs(str(node)), FakeNvml(nvml), ROOT_VIEW, now=T0, is_root=True)
    odata = json.loads(json.dumps(seen.to_dict()))
    assert [h["pid"] for h in odata["d_state_holders"]] == [500]
    assert odata["summary"]["d_state_holders"] == 1
    otext = render_observe(seen)
    assert "<- D state, holds the GPU" in otext and "D STATE: pid 500 (python3) holds 2658 MiB on GPU 0" in otext


def test_a_real_process_in_d_holding_a_stand_in_device(tmp_path):
    """A real D-state process (a posix_spawn parent whose vfork child blocks on a FIFO) that holds a
    stand-in /dev/nvidia0, on the live /proc: named, then timed across two scans, then gone once
    it leaves D. Its child holds the same fd in state S: a holder, not in D."""
    device = tmp_path / "nvidia0"  # a stand-in: no GPU here, and the agent judges only the fd's path
    device.write_text("")
    procfs = Procfs("/proc", device_prefix=str(tmp_path / "nvidia"))
    monotonic = [0.0]
    tracker = DStateTracker(clock=lambda: monotonic[0])

    def live_scan(at: float):
        monotonic[0] = at
        return scan_node(
            procfs=procfs,
            nvml=FakeNvml(GpuSnapshot(available=False, reason="no GPU here")),
            view=ReaderView(in_root_pidns=True, own_pid=os.getpid()),
            names=lambda ids: CriNames(source=None),
            resources=lambda: PodResources(source=None),
            now=T0 + at,
            dstate=tracker,
        )

    with d_state_process(tmp_path, device) as stuck:
        first = live_scan(0)
        assert [h.pid for h in first.trace.d_state] == [stuck.pid]
        (held,) = first.trace.d_state
        assert held.devices == (str(device),) and held.gpu_memory == 0
        assert seconds(live_scan(30)) == {"": 30.0}  # no pod: the test's own process
    assert seconds(live_scan(60)) == {}
