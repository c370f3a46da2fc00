"""MIG-correct accounting through the real ``PynvmlBackend`` over a stand-in ``pynvml`` (tests/
fake_pynvml.py: nvidia-ml-py's names, errors and structs; no MIG GPU here): each GPU instance read
through its MIG device handles, the ghost arithmetic per instance, dcgm-exporter's GPU_I_ID and
GPU_I_PROFILE on the series (absent without MIG), and never a ghost because the whole GPU's process
list is empty. Memory figures are the stand-in's, not measured."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")


import pynvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import fake_pynvml as nv
from cri_standin import standin_kubelet
from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.exporter import NodeCollector, scan_node
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.deviceids import kubelet_ids, without_replica
from gpuzombie.gpu.nvml import FakeNvml, PynvmlBackend
from gpuzombie.k8s.names import ContainerNames, CriNames
from gpuzombie.k8s.podresources import PodResources, list_pod_resources
from gpuzombie.observe.model import observe
from gpuzombie.observe.render import render_text as render_observe
from gpuzombie.proc.procfs import Procfs
from gpuzombie.trace.model import trace_node
from gpuzombie.trace.render import render_text

MIB = nv.MIB
GIB = 1024 * MIB
ROOT = ReaderView(in_root_pidns=True)
GI1_UUID, GI2_UUID = "MIG-11111111-1111-1111-1111-111111111111", "MIG-22222222-2222-2222-2222-222222222222"


def small(*, extra: int = 0) -> nv.MigDevice:
    """GPU instance 1 (1g.18gb): pid 4242 holds 10 GiB; ``extra`` bytes nobody accounts for."""
    return nv.MigDevice(
        1,
        0,
        GI1_UUID,
        "NVIDIA H200 MIG 1g.18gb",
        nv.Memory(16896 * MIB, 13 * MIB + 10 * GIB + extra),
        [(4242, 10 * GIB)],
    )


def large() -> nv.MigDevice:
    """GPU instance 2 (3g.71gb), idle."""
    return nv.MigDevice(2, 0, GI2_UUID, "NVIDIA H200 MIG 3g.71gb", nv.Memory(71680 * MIB, 13 * MIB), slices=3)


def machine(*, extra: int = 0, **gpu0: object) -> list[nv.Gpu]:
    """GPU 0 in MIG mode (instances 1 and 2, an empty slot between), GPU 1 without MIG."""
    slots = [small(extra=extra), None, large(), None, None, None, None]
    used = sum(m.memory.used for m in slots if m)
    mig_gpu = nv.Gpu("GPU-0000", "NVIDIA H200", nv.Memory(140 * GIB, used), mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE)
    mig_gpu.slots = slots
    for key, value in gpu0.items():
        setattr(mig_gpu, key, value)
    plain = nv.Gpu("GPU-1111", "NVIDIA H200", nv.Memory(140 * GIB, 2615 * MIB, 615 * MIB), [(5151, 2000 * MIB)])
    return [mig_gpu, plain]


def read(gpus: list[nv.Gpu], **kwargs):
    return PynvmlBackend(nv.module(gpus, **kwargs)).read()


def build_node(root):
    """4242 in GPU instance 1 of GPU 0 (holds /dev/nvidia0 and its MIG capability), 5151 on GPU 1."""
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd")
    make_fake_proc(root, 4242, ppid=1, fds=("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidiactl"))
    make_fake_proc(root, 5151, ppid=1, fds=("/dev/nvidia1", "/dev/nvidiactl"))
    return root


@pytest.fixture
def node(tmp_path):
    return build_node(tmp_path / "proc")


def test_each_gpu_instance_is_read_through_its_mig_handles():
    snap = read(machine())
    assert snap.available
    assert [(d.index, d.uuid, d.mig_mode, d.mig and d.mig.gpu_instance_id) for d in snap.devices] == [
        (0, "GPU-0000", True, 1),
        (0, "GPU-0000", True, 2),
        (1, "GPU-1111", False, None),
    ]
    gi1, gi2, plain = snap.devices
    assert gi1.mig.profile == "1g.18gb" and gi2.mig.profile == "3g.71gb"
    assert gi1.mig.uuids == (GI1_UUID,) and (gi1.mig.slots, gi2.mig.slots) == ((0,), (2,))
    assert (gi1.memory_total, gi1.memory_used) == (16896 * MIB, 13 * MIB + 10 * GIB)  # the instance's own
    assert [(p.pid, p.used_memory) for p in gi1.processes] == [(4242, 10 * GIB)] and gi2.processes == ()
    assert gi1.device_node == "/dev/nvidia0" and gi1.name == "NVIDIA H200"  # the parent's, as dcgm-exporter
    assert [(p.pid, p.used_memory) for p in plain.processes] == [
        (5151, 2000 * MIB)
    ] and plain.memory_reserved == 615 * MIB


def test_mig_memory_is_no_ghost_though_the_whole_gpu_lists_no_process(node):
    """The whole GPU 0 lists no process to an unprivileged caller while 10 GiB are used: per instance
    every MiB is accounted for."""
    whole = nv.module(machine())
    assert whole.nvmlDeviceGetComputeRunningProcesses(whole.nvmlDeviceGetHandleByIndex(0)) == []
    report = observe(Procfs(str(node)), PynvmlBackend(whole), ROOT, is_root=True)
    assert [(g.gpu_index, g.mig and g.mig.gpu_instance_id, g.verdict) for g in report.attribution.ghosts] == [
        (0, 1, "ok"),
        (0, 2, "ok"),
        (1, None, "ok"),
    ]
    assert report.summary.ghost_gpus == 0 and report.summary.healthy
    text = render_observe(report)
    assert "0/GI1  NVIDIA H200 MIG 1g.18gb" in text and "GPU 0/GI2: used 13 MiB" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["gpu"]["devices"][0]["mig"]["profile"] == "1g.18gb" and data["gpu"]["devices"][2]["mig"] is None
    assert data["gpu_processes"][0]["mig"]["gpu_instance_id"] == 1


def test_instances_that_cannot_be_read_are_cannot_tell_never_ghost(node):
    """No MIG device handle readable (here NO_PERMISSION): the whole GPU, with MIG mode and its empty
    process list, is cannot_tell with that reason; the GPU without MIG is judged as always."""
    gpus = machine(fail={"nvmlDeviceGetMigDeviceHandleByIndex": pynvml.NVML_ERROR_NO_PERMISSION})
    snap = read(gpus)
    (whole, plain) = snap.devices
    assert whole.mig_mode and whole.mig is None and not whole.processes_read and whole.memory_used > 10 * GIB
    report = observe(Procfs(str(node)), FakeNvml(snap), ROOT, is_root=True)
    ghost0 = report.attribution.ghosts[0]
    assert ghost0.verdict == "cannot_tell" and not ghost0.flagged
    assert ghost0.likely_causes == (
        "MIG mode is on and no GPU instance could be read: NVML lists a MIG GPU's processes per instance "
        "(the whole GPU's only to a privileged caller), so an empty list proves nothing",
    )
    assert report.attribution.ghosts[1].verdict == "ok" and plain.processes_read
    assert report.summary.ghost_gpus == 0


def test_ghost_arithmetic_is_per_instance(node):
    """2 GiB nobody holds in instance 1 is its ghost; instance 2 of the same GPU stays ok."""
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=PynvmlBackend(nv.module(machine(extra=2 * GIB))),
        view=ROOT,
        names=lambda ids: CriNames(source=None),
        resources=PodResources(source=None),
        now=1_800_000_000.0,
    )
    gi1, gi2, plain = report.gpus
    assert (gi1.mig.gpu_instance_id, gi1.verdict, gi1.unexplained) == (1, "ghost", 13 * MIB + 2 * GIB)
    assert (gi2.verdict, plain.verdict) == ("ok", "ok")
    (row,) = [r for r in report.rows if r.pid == 4242]
    assert row.mig.gpu_instance_id == 1 and row.gpu_memory == 10 * GIB
    text = render_text(report)
    assert "GPU 0 MIG 1g.18gb (GI 1) NVIDIA H200 (GPU-0000): used 12301 MiB = baseline 0 MiB" in text
    assert "[GHOST]" in text and "4242  4242   S      0/GI1  10240 MiB  Y" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["gpus"][0]["mig"] == {
        "gpu_instance_id": 1,
        "profile": "1g.18gb",
        "compute_instance_ids": [0],
        "uuids": [GI1_UUID],
        "slots": [0],
    }
    assert data["gpus"][2]["mig"] is None and data["rows"][0]["mig"]["gpu_instance_id"] == 1


def test_compute_instances_of_one_gpu_instance_are_one_instance():
    """A 2g GPU instance split into two compute instances: two MIG devices sharing one memory; one
    instance with both processes, its memory counted once."""
    memory = nv.Memory(35840 * MIB, 13 * MIB + 3 * GIB)
    ci0 = nv.MigDevice(3, 0, "MIG-c0", "NVIDIA H200 MIG 1c.2g.35gb", memory, [(6001, 1 * GIB)], slices=2)
    ci1 = nv.MigDevice(3, 1, "MIG-c1", "NVIDIA H200 MIG 1c.2g.35gb", memory, [(6002, 2 * GIB)], slices=2)
    gpu = nv.Gpu("GPU-0000", "NVIDIA H200", memory, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, slots=[ci0, ci1])
    (instance,) = read([gpu]).devices
    assert instance.mig.profile == "2g.35gb" and instance.mig.compute_instance_ids == (0, 1)
    assert instance.mig.uuids == ("MIG-c0", "MIG-c1")
    assert instance.memory_used == 13 * MIB + 3 * GIB and instance.process_memory == 3 * GIB


def test_profile_from_attributes_when_the_name_has_none():
    mig = dataclasses.replace(large(), name="NVIDIA H200")
    gpu = nv.Gpu("GPU-0000", "NVIDIA H200", mig.memory, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, slots=[mig])
    (instance,) = read([gpu]).devices
    assert instance.mig.profile == "3g.70gb"  # 71680 MiB: the slice count and GiB, rounded up


def test_mig_mode_without_instances_is_the_whole_gpu():
    gpu = nv.Gpu("GPU-0000", "NVIDIA H200", nv.Memory(140 * GIB, 40 * MIB), mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE)
    gpu.slots = [None] * 7
    (whole,) = read([gpu]).devices
    assert whole.mig_mode and whole.mig is None and whole.memory_used == 40 * MIB


def test_mig_mode_off_reads_the_whole_gpu_as_before():
    gpu = nv.Gpu("GPU-0000", "NVIDIA A100", nv.Memory(80 * GIB, 600 * MIB), [(7, 500 * MIB)])
    gpu.mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE  # capable, off
    (whole,) = read([gpu]).devices
    assert not whole.mig_mode and whole.mig is None and [p.pid for p in whole.processes] == [7]


def test_replay_keeps_the_instances():
    snap = read(machine())
    assert FakeNvml.from_dict(dataclasses.asdict(snap)).read() == snap


def test_kubelet_allocations_by_mig_uuid(node, tmp_path):
    """PodResources (a real gRPC server) gives MIG-… ids: each instance names the pod it went to."""
    sock = str(tmp_path / "kubelet.sock")
    with standin_kubelet(sock, {("ml", "small-job"): {"worker": (GI1_UUID,)}}):
        resources = list_pod_resources(sock)
    report = trace_node(
        procfs=Procfs(str(node)),
        nvml=PynvmlBackend(nv.module(machine(extra=2 * GIB))),
        view=ROOT,
        names=lambda ids: CriNames(source=None),
        resources=resources,
        now=1_800_000_000.0,
    )
    gi1, gi2, _ = report.gpus
    assert [(a.namespace, a.pod, a.container) for a in gi1.allocated_to] == [("ml", "small-job", "worker")]
    assert gi2.allocated_to == ()


def exposition(node) -> str:
    """The exporter's exposition of ``node`` with ``machine(extra=2 GiB)``: instance 1 has a ghost."""
    scan = scan_node(
        procfs=Procfs(str(node)),
        nvml=PynvmlBackend(nv.module(machine(extra=2 * GIB))),
        view=ROOT,
        names=lambda ids: CriNames(source=None),
        resources=lambda: PodResources(source=None),
        node_name="gpu-node-1",
    )
    registry = CollectorRegistry()
    registry.register(NodeCollector(lambda: scan, min_interval=60))
    return generate_latest(registry).decode()


def series(node) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(exposition(node)):
        for s in family.samples:
            found.setdefault(s.name, []).append({**s.labels, "value": s.value})
    return found


def test_series_carry_dcgm_exporters_mig_labels(node):
    m = series(node)
    mig1 = {"gpu": "0", "UUID": "GPU-0000", "Hostname": "gpu-node-1", "GPU_I_ID": "1", "GPU_I_PROFILE": "1g.18gb"}
    mig2 = {**mig1, "GPU_I_ID": "2", "GPU_I_PROFILE": "3g.71gb"}
    plain = {"gpu": "1", "UUID": "GPU-1111", "Hostname": "gpu-node-1"}  # no MIG labels at all, as dcgm-exporter
    assert m["gpuzombie_gpu_unexplained_memory_bytes"] == [
        {**mig1, "value": 13 * MIB + 2 * GIB},
        {**mig2, "value": 13 * MIB},
        {**plain, "value": 0},
    ]
    assert {**mig1, "verdict": "ghost", "value": 1.0} in m["gpuzombie_gpu_memory_verdict"]
    assert {**mig2, "model": "NVIDIA H200", "value": 71680 * MIB} in m["gpuzombie_gpu_memory_total_bytes"]
    (worker,) = [s for s in m["gpuzombie_gpu_process_memory_bytes"] if s["gpu"] == "0"]
    assert worker["GPU_I_ID"] == "1" and worker["GPU_I_PROFILE"] == "1g.18gb" and worker["value"] == 10 * GIB
    (other,) = [s for s in m["gpuzombie_gpu_process_memory_bytes"] if s["gpu"] == "1"]
    assert "GPU_I_ID" not in other and "GPU_I_PROFILE" not in other


SMALL_JOB = ("ml", "small-job", "0a0a0a0a-1111-4111-8111-111111111111", "a" * 64)
"""namespace, pod, pod UID, container id of pid 4242 (GPU instance 1 of GPU 0)."""
BIG_JOB = ("ml", "big-job", "0b0b0b0b-2222-4222-8222-222222222222", "b" * 64)
"""... of pid 5151 (GPU 1, no MIG)."""


def pod_names(ids) -> CriNames:
    """The runtime's names of the two pods' containers (the stand-in lookup trace takes)."""
    pods = (SMALL_JOB, BIG_JOB)
    found = {cid: ContainerNames(cid, "worker", pod, ns, uid, "CONTAINER_RUNNING") for ns, pod, uid, cid in pods}
    return CriNames(source="stand-in", containers={cid: found[cid] for cid in ids if cid in found})


@pytest.fixture
def pods_node(node):
    """``build_node``'s processes, each in its pod's container cgroup."""
    for pid, (_, _, uid, cid) in ((4242, SMALL_JOB), (5151, BIG_JOB)):
        slice_ = f"kubepods-pod{uid.replace('-', '_')}.slice"
        (node / str(pid) / "cgroup").write_text(f"0::/kubepods.slice/{slice_}/cri-containerd-{cid}.scope\n")
    return node


def trace_with_kubelet(node, tmp_path, kubelet: dict):
    sock = str(tmp_path / "kubelet.sock")
    with standin_kubelet(sock, kubelet):
        resources = list_pod_resources(sock)
    return trace_node(
        procfs=Procfs(str(node)),
        nvml=PynvmlBackend(nv.module(machine())),
        view=ROOT,
        names=pod_names,
        resources=resources,
        now=1_800_000_000.0,
    )


# Each id form NVIDIA's device plugin can give the kubelet (gpu/deviceids.py), for each pod's device;
# and whether the id names the whole GPU 0 (both of its instances) rather than instance 1 alone.
MIG_FORMS = {
    "MIG UUID": (GI1_UUID, False),
    "MIG UUID, replica": (f"{GI1_UUID}::2", False),
    "MIG-GPU-uuid/gi/ci (before R470)": ("MIG-GPU-0000/1/0", False),
    "index i:j": ("0:0", False),
    "GPU UUID (mig-strategy none)": ("GPU-0000", True),
    "index i (mig-strategy none)": ("0", True),
}
GPU_FORMS = {"GPU UUID": "GPU-1111", "GPU UUID, replica": "GPU-1111::3", "index": "1", "index, replica": "1::0"}


@pytest.mark.parametrize("mig_form", MIG_FORMS)
@pytest.mark.parametrize("gpu_form", GPU_FORMS)
def test_every_device_plugin_id_form_names_its_own_pods_gpu(pods_node, tmp_path, mig_form, gpu_form):
    """Issue 29 item 6: the kubelet gave each pod the device its process runs on. On 241ae16 pid 4242
    was 'foreign: the kubelet assigned GPU-0000 to no pod' for every MIG form (trace compared the
    kubelet's ids with the parent GPU's UUID) and 5151 for the index forms; allocated_to missed the
    replica forms and the index forms. Now no holder is foreign and each entry names its pod."""
    mig_id, whole = MIG_FORMS[mig_form]
    kubelet = {("ml", "small-job"): {"worker": (mig_id,)}, ("ml", "big-job"): {"worker": (GPU_FORMS[gpu_form],)}}
    report = trace_with_kubelet(pods_node, tmp_path, kubelet)
    rows = {r.pid: r for r in report.rows if r.pid in (4242, 5151)}
    assert {pid: (r.pod, r.dirty, r.dirty_reason) for pid, r in rows.items()} == {
        4242: ("small-job", None, None),
        5151: ("big-job", None, None),
    }
    assert report.checks.foreign and report.summary.foreign == 0
    gi1, gi2, plain = ([(a.pod, a.container) for a in g.allocated_to] for g in report.gpus)
    assert (gi1, gi2, plain) == (
        [("small-job", "worker")],
        [("small-job", "worker")] if whole else [],
        [("big-job", "worker")],
    )


def test_a_pod_on_another_instance_or_resource_is_foreign(pods_node, tmp_path):
    """What the forms name is exact: instance 2's id, or GPU 1's index, does not cover instance 1."""
    report = trace_with_kubelet(
        pods_node, tmp_path, {("ml", "small-job"): {"worker": (GI2_UUID,)}, ("ml", "big-job"): {"worker": ("0:2",)}}
    )
    rows = {r.pid: (r.dirty, r.dirty_reason) for r in report.rows if r.pid in (4242, 5151)}
    assert rows == {
        4242: ("foreign", "the kubelet assigned GPU-0000 GPU instance 1 to no pod"),
        5151: ("foreign", "the kubelet assigned GPU-1111 to no pod"),
    }
    assert [[a.pod for a in g.allocated_to] for g in report.gpus] == [[], ["big-job", "small-job"], []]


def test_kubelet_ids_of_each_nvml_entry():
    gi1, gi2, plain = read(machine()).devices
    assert kubelet_ids(gi1.uuid, gi1.index, gi1.mig) == {"GPU-0000", "0", GI1_UUID, "MIG-GPU-0000/1/0", "0:0"}
    assert kubelet_ids(gi2.uuid, gi2.index, gi2.mig) == {"GPU-0000", "0", GI2_UUID, "MIG-GPU-0000/2/0", "0:2"}
    assert kubelet_ids(plain.uuid, plain.index, plain.mig) == {"GPU-1111", "1"}
    assert without_replica("GPU-1111::3") == without_replica("GPU-1111") == "GPU-1111"


def test_only_nvidia_resources_name_gpus():
    """Another plugin's device "0" (a NIC, an FPGA) is no GPU index."""
    from gpuzombie.k8s.podresources import DeviceAssignment

    resources = PodResources(
        source="kubelet.sock",
        assignments=(
            DeviceAssignment("ml", "a", "c", "example.com/nic", "0"),
            DeviceAssignment("ml", "b", "c", "nvidia.com/mig-1g.18gb", GI1_UUID),
        ),
    )
    assert [a.pod for a in resources.gpu_assignments] == ["b"]
