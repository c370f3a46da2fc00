"""The exporter's handover series (issue 25 item 2): per GPU and MIG instance, whether it is clean to
hand to the next pod (``handover.verdict.judge``, preflight's verdict) and the memory its stale,
foreign, D-state and ghost holders keep. A fake node (fake /proc, NVML records, the runtime's and the
kubelet's answers as data) scraped over the real HTTP endpoint, as tests/test_exporter.py does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from prometheus_client import CollectorRegistry

from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root
from gpufakes import gpu_device, gpu_process, gpu_snapshot
from gpuzombie.exporter import NodeCollector, PrometheusExporter, parse_listen, scan_node
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot, MigInstance
from gpuzombie.k8s.liveness import RuntimePods
from gpuzombie.k8s.names import ContainerNames, CriNames
from gpuzombie.k8s.podresources import DeviceAssignment, PodResources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB
from test_exporter import cgroup, labels, scrape

UID_GONE, UID_TRAIN, UID_INTRUDE, UID_STUCK = (f"{n}{n}{n}{n}{n}{n}{n}{n}-0000-0000-0000-000000000000" for n in "1234")
CID_GONE, CID_TRAIN, CID_INTRUDE, CID_STUCK = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)
PODS = {
    CID_GONE: ("gone-0", UID_GONE),
    CID_TRAIN: ("trainer-0", UID_TRAIN),
    CID_INTRUDE: ("intruder-0", UID_INTRUDE),
    CID_STUCK: ("stuck-0", UID_STUCK),
}
NODE = "gpu-node-1"
MIG_3G = MigInstance(gpu_instance_id=2, profile="3g.71gb", compute_instance_ids=(0,), uuids=("MIG-aaaa",))


def build_node(root: Path) -> None:
    """One process a pod: the stale pod's (its pod gone from the runtime), the trainer's and the
    intruder's (the kubelet gave GPU 1 to the trainer only), and a process stuck in state D."""
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0", pidns=TREE_PIDNS)
    for pid, cid, state in (
        (500, CID_GONE, "S"),
        (600, CID_TRAIN, "S"),
        (700, CID_INTRUDE, "S"),
        (800, CID_STUCK, "D"),
    ):
        proc = make_fake_proc(root, pid, ppid=1, state=state, nspid=(pid, 1), pidns=4026533000 + pid)
        (proc / "cgroup").write_text(cgroup(PODS[cid][1], cid))


def nvml() -> GpuSnapshot:
    """GPU 0: the stale holder; 1: trainer and intruder; 2: the D-state process; 3: idle; 4: 2000 MiB
    nobody lists (a ghost); 5: MIG mode, one idle instance; 6: NVML would not list its processes; 7:
    700 MiB NVML lists for pid 999, which no longer exists (gone: the seed's orphaned context)."""
    return gpu_snapshot(
        gpu_device(0, processes=[gpu_process(500, mib=2000)]),
        gpu_device(1, processes=[gpu_process(600, mib=500), gpu_process(700, mib=1000)]),
        gpu_device(2, processes=[gpu_process(800, mib=3000)]),
        gpu_device(3),
        gpu_device(4, used=(615 + 2000) * MIB),
        dataclasses.replace(gpu_device(5, total=71 * 1024 * MIB), mig_mode=True, mig=MIG_3G),
        dataclasses.replace(gpu_device(6), processes_read=False),
        gpu_device(7, processes=[gpu_process(999, mib=700)]),
    )


def names(ids) -> CriNames:
    found = {
        cid: ContainerNames(cid, "worker", pod, "ml", uid, "CONTAINER_RUNNING")
        for cid, (pod, uid) in PODS.items()
        if cid in set(ids) and cid != CID_GONE
    }
    return CriNames(source="fake", containers=found)


RUNNING = RuntimePods(source="fake", ready=frozenset({UID_TRAIN, UID_INTRUDE, UID_STUCK}))
KUBELET = PodResources(
    source="fake",
    assignments=(DeviceAssignment("ml", "trainer-0", "worker", "nvidia.com/gpu", "GPU-1"),),
    pods=frozenset({("ml", "trainer-0"), ("ml", "intruder-0"), ("ml", "stuck-0")}),
)


@pytest.fixture
def served(tmp_path):
    """The fake node served over HTTP on 127.0.0.1; ``snapshot`` holds what NVML answers."""
    root = tmp_path / "proc"
    build_node(root)
    snapshot = [nvml()]

    def scan():
        return scan_node(
            procfs=Procfs(str(root)),
            nvml=FakeNvml(snapshot[0]),
            view=ReaderView(in_root_pidns=True),
            names=names,
            resources=lambda: KUBELET,
            node_name=NODE,
            pods=lambda: RUNNING,
        )

    registry = CollectorRegistry()
    registry.register(NodeCollector(scan, min_interval=0))
    exporter = PrometheusExporter(registry, listen=parse_listen("127.0.0.1:0"))
    port = exporter.start().port
    yield f"http://127.0.0.1:{port}/metrics", snapshot
    exporter.stop()


def gpu(index: int, **extra: str) -> tuple:
    return labels(gpu=str(index), UUID=f"GPU-{index}", Hostname=NODE, **extra)


def test_each_gpu_has_one_verdict_and_held_memory_only_where_found(served):
    url, _ = served
    m = scrape(url)
    mig = {"GPU_I_ID": "2", "GPU_I_PROFILE": "3g.71gb"}
    assert m["gpuzombie_gpu_handover_clean"] == {
        gpu(0): 0.0,  # the stale holder
        gpu(1): 0.0,  # in use (the trainer) and an intruder
        gpu(2): 0.0,  # the D-state process
        gpu(3): 1.0,  # idle: the driver's reservation only
        gpu(4): 0.0,  # 2000 MiB nobody lists
        gpu(5, **mig): 1.0,  # the MIG instance, with dcgm-exporter's labels
        gpu(6): 0.0,  # its processes could not be listed: never clean
        gpu(7): 0.0,
    }
    assert m["gpuzombie_gpu_held_memory_bytes"] == {
        gpu(0, holder="stale"): 2000 * MIB,
        gpu(1, holder="foreign"): 1000 * MIB,
        gpu(2, holder="dstate"): 3000 * MIB,
        gpu(4, holder="ghost"): 2000 * MIB,
        gpu(7, holder="ghost"): 700 * MIB,
    }


def test_a_clean_node_has_one_series_a_gpu_and_no_held_memory(served):
    url, snapshot = served
    snapshot[0] = gpu_snapshot(*(gpu_device(i) for i in range(8)))
    m = scrape(url)
    assert m["gpuzombie_gpu_handover_clean"] == {gpu(i): 1.0 for i in range(8)}
    assert "gpuzombie_gpu_held_memory_bytes" not in m


def test_without_nvml_no_gpu_is_judged_and_nvml_available_says_why(served):
    url, snapshot = served
    snapshot[0] = GpuSnapshot(available=False, reason="NVML Shared Library Not Found")
    m = scrape(url)
    assert m["gpuzombie_nvml_available"] == {(): 0.0}
    assert "gpuzombie_gpu_handover_clean" not in m and "gpuzombie_gpu_held_memory_bytes" not in m


def test_without_the_drivers_reservation_the_given_baseline_is_subtracted(tmp_path):
    """A driver without NVML's v2 memory info: an idle GPU's own footprint is dirty unless
    --baseline-mib gives it, as preflight's ``baseline_bytes``."""
    root = tmp_path / "proc"
    build_node(root)
    idle = gpu_snapshot(gpu_device(0, reserved=None, used=615 * MIB))
    from gpuzombie.exporter.metrics import handover_metrics

    def clean(baseline: int | None) -> float:
        scan = scan_node(
            procfs=Procfs(str(root)),
            nvml=FakeNvml(idle),
            view=ReaderView(in_root_pidns=True),
            names=names,
            resources=lambda: KUBELET,
            node_name=NODE,
            baseline=baseline,
        )
        return handover_metrics(scan)["gpuzombie_gpu_handover_clean"][("0", "GPU-0", NODE, "", "")]

    assert clean(None) == 0.0
    assert clean(615 * MIB) == 1.0
