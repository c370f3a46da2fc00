"""DRA-allocated GPUs on the node, end to end: a stand-in kubelet (a real gRPC server built from the
kubelet's own PodResources proto, serving DRA claims; no kubelet runs here), CDI spec files in the
layout and format NVIDIA's DRA driver writes them (tests/fixtures/cdi), a fake node procfs
(test_trace's node), a stand-in CRI runtime, and NVML replayed with GPU minor numbers that differ
from the indexes, so only the minor number can name the right GPU.

Pod A (gpu-zombie-test/gpu-zombie-nofix, pid 200 on GPU 0) holds the GPU its claim got: attributed,
labelled with the claim, not foreign. Pod B (training/nccl-rank1, pid 300 on GPU 1) holds GPU 1 but
its claim got GPU 2: foreign. On 7f55d4c (stubs without dynamic_resources) both were foreign.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")

from cri_standin import standin_kubelet, standin_runtime
from gpufakes import gpu_device
from gpuzombie.cli.main import main
from gpuzombie.k8s.podresources import DraClaim, list_pod_resources
from gpuzombie.k8s.podresources_v1 import api_pb2 as pr
from test_cdi import CLAIM, FIXTURES
from test_trace import RECORDED, build_node, gpus

CLAIM_B = "77f4d1b2-0c8e-4a57-9d3e-2b6a1c9e8f10"
POD_A = ("gpu-zombie-test", "gpu-zombie-nofix")
POD_B = ("training", "nccl-rank1")
PODS = (POD_A[1], POD_B[1])


def dra_gpus():
    """test_trace's GPUs 0 (GPU-0000) and 1 (GPU-1111) with minors 1 and 0, and an idle GPU 2 (minor 2)."""
    zero, one = gpus().devices
    idle = dataclasses.replace(gpu_device(2, uuid="GPU-2222"), minor_number=2)
    devices = (dataclasses.replace(zero, minor_number=1), dataclasses.replace(one, minor_number=0), idle)
    return dataclasses.replace(gpus(), devices=devices)


def claim(name: str, namespace: str, uid: str, device: str) -> pr.DynamicResource:
    """A DRA device as the kubelet reports it: NVIDIA's driver, its node's pool, the CDI device the
    driver's NodePrepareResources returned (k8s.gpu.nvidia.com/claim=<claim UID>-<device>)."""
    cdi = pr.CDIDevice(name=f"k8s.gpu.nvidia.com/claim={uid}-{device}")
    resource = pr.ClaimResource(cdi_devices=[cdi], driver_name="gpu.nvidia.com", pool_name="node-a", device_name=device)
    return pr.DynamicResource(claim_name=name, claim_namespace=namespace, claim_resources=[resource])


@pytest.fixture
def node(tmp_path):
    """procfs, CRI socket, kubelet socket, NVML replay and the CDI root of a DRA node."""
    root = tmp_path / "proc"
    root.mkdir()
    build_node(root)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    shutil.copy(FIXTURES / f"k8s.gpu.nvidia.com-claim_{CLAIM}.yaml", cdi)  # gpu-1: /dev/nvidia1
    spec_b = (FIXTURES / f"k8s.gpu.nvidia.com-claim_{CLAIM}.yaml").read_text().replace(CLAIM, CLAIM_B)
    spec_b = (
        spec_b.replace("/dev/nvidia1", "/dev/nvidia2").replace("minor: 1\n", "minor: 2\n").replace("gpu-1", "gpu-2")
    )
    (cdi / f"k8s.gpu.nvidia.com-claim_{CLAIM_B}.yaml").write_text(spec_b)
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(dra_gpus())))
    dynamic = {
        POD_A: {"worker": [claim("train-gpu", "gpu-zombie-test", CLAIM, "gpu-1")]},
        POD_B: {"rank": [claim("rank-gpu", "training", CLAIM_B, "gpu-2")]},
    }
    kubelet = tmp_path / "kubelet.sock"
    with (
        standin_runtime(str(tmp_path / "cri.sock"), RECORDED),
        standin_kubelet(str(kubelet), {POD_A: {"worker": ()}, POD_B: {"rank": ()}}, dynamic),
    ):
        yield {"procfs": root, "cri": tmp_path / "cri.sock", "kubelet": kubelet, "replay": replay, "cdi": cdi}


def argv(node, *cdi_dirs):
    dirs = [a for d in cdi_dirs for a in ("--cdi-dir", str(d))]
    return [
        *("--procfs", str(node["procfs"]), "--cri-socket", str(node["cri"])),
        *("--pod-resources-socket", str(node["kubelet"]), "--nvml-replay", str(node["replay"]), *dirs),
    ]


def test_dra_devices_become_gpu_node_assignments_with_their_claim(node):
    got = list_pod_resources(str(node["kubelet"]), timeout=5, cdi_dirs=(str(node["cdi"]),))
    assert got.read and got.dra_warnings == () and got.unresolved_dra == frozenset()
    assert [(a.pod, a.container, a.resource, a.device_id, a.claim) for a in got.gpu_assignments] == [
        (
            "gpu-zombie-nofix",
            "worker",
            "gpu.nvidia.com",
            "/dev/nvidia1",
            DraClaim("train-gpu", "gpu-zombie-test", "gpu.nvidia.com", "node-a", "gpu-1"),
        ),
        (
            "nccl-rank1",
            "rank",
            "gpu.nvidia.com",
            "/dev/nvidia2",
            DraClaim("rank-gpu", "training", "gpu.nvidia.com", "node-a", "gpu-2"),
        ),
    ]


def test_a_dra_pods_holder_is_attributed_labelled_and_not_foreign(node, capsys):
    assert main(["trace", "--json", *argv(node, node["cdi"])]) == 1  # ghost memory, a zombie: test_trace's node
    doc = json.loads(capsys.readouterr().out)
    rows = {r["pid"]: r for r in doc["rows"] if r["nsmi"]}
    assert rows[200]["pod"] == "gpu-zombie-nofix" and rows[200]["dirty"] is None
    assert rows[300]["dirty"] == "foreign" and rows[300]["dirty_reason"] == "the kubelet assigned GPU-1111 to no pod"
    assert doc["summary"]["foreign"] == 1 and doc["checks"]["foreign"] is True
    gpu0, gpu1, gpu2 = doc["gpus"]
    assert gpu0["allocated_to"] == [
        {
            "namespace": "gpu-zombie-test",
            "pod": "gpu-zombie-nofix",
            "container": "worker",
            "claim": {
                "claim_name": "train-gpu",
                "claim_namespace": "gpu-zombie-test",
                "driver": "gpu.nvidia.com",
                "pool": "node-a",
                "device": "gpu-1",
            },
        }
    ]
    assert gpu1["allocated_to"] == [] and [a["pod"] for a in gpu2["allocated_to"]] == ["nccl-rank1"]

    assert main(["exporter", "--once", *argv(node, node["cdi"])]) == 0
    text = capsys.readouterr().out
    (allocation,) = [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dra_gpu_allocation{") and 'UUID="GPU-0000"' in line
    ]
    for label in (
        'dra_claim_name="train-gpu"',
        'dra_claim_namespace="gpu-zombie-test"',
        'dra_driver_name="gpu.nvidia.com"',
        'dra_pool_name="node-a"',
        'dra_device_name="gpu-1"',
        'pod="gpu-zombie-nofix"',
        'container="worker"',
        'gpu="0"',
    ):
        assert label in allocation, label
    foreign = [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dirty_gpu_holders{") and 'kind="foreign"' in line
    ]
    assert len(foreign) == 1 and 'pod="nccl-rank1"' in foreign[0]


def test_a_dra_device_without_its_cdi_spec_is_not_judged(node, tmp_path, capsys):
    """No spec (another CDI root than the driver's): which GPU the claim got is unknown, so its
    pods' holders are not called foreign; one warning says which device."""
    assert main(["trace", "--json", *argv(node, tmp_path / "empty")]) == 1
    doc = json.loads(capsys.readouterr().out)
    rows = {r["pid"]: r for r in doc["rows"] if r["nsmi"]}
    assert rows[200]["dirty"] is None and rows[300]["dirty"] is None and doc["checks"]["foreign"] is True
    (warning,) = [w for w in doc["warnings"] if w.startswith("DRA devices with no CDI spec")]
    assert "gpu-zombie-test/gpu-zombie-nofix gpu.nvidia.com/node-a/gpu-1" in warning


def test_cdi_dirs_from_the_environment(node, monkeypatch, capsys):
    """GPUZOMBIE_CDI_DIRS, colon-separated as click splits a path list: the DaemonSet's way."""
    monkeypatch.setenv("GPUZOMBIE_CDI_DIRS", f"/nonexistent:{node['cdi']}")
    assert main(["trace", "--json", *argv(node)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [r["dirty"] for r in doc["rows"] if r["nsmi"] and r["pid"] == 200] == [None]


def test_top_takes_the_cdi_dirs_trace_and_the_exporter_take(node, tmp_path, capsys):
    """top judges DRA pods from the CDI specs it is pointed at (--cdi-dir, shared with trace and the
    exporter): with the driver's, pod B's holder is foreign and pod A's is not; with none, neither."""

    def marks(*cdi_dirs) -> dict[str, object]:
        assert main(["top", "--once", "--json", *argv(node, *cdi_dirs)]) == 0
        frame = json.loads(capsys.readouterr().out)
        return {p["pod"]: p["dirty"] for g in frame["groups"] for p in g["pods"] if p["pod"] in PODS}

    assert marks(node["cdi"]) == {"gpu-zombie-nofix": None, "nccl-rank1": "foreign"}
    assert set(marks(tmp_path / "empty").values()) == {None}
