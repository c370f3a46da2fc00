"""The kubelet PodResources client on generated stubs: against real grpcio servers, bounded on a
silent socket, and the committed stubs are exactly what ``make proto`` generates."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="grpcio is in the 'node' extra")
pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")

import grpc

from cri_standin import standin_kubelet
from gpuzombie.k8s.podresources import DeviceAssignment, PodResources, list_pod_resources

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "gpuzombie" / "k8s" / "podresources_v1"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_assignments_of_every_container(tmp_path):
    sock = tmp_path / "kubelet.sock"
    pods = {("ml", "trainer"): {"rank0": ("GPU-a",), "rank1": ("GPU-b", "GPU-c")}, ("web", "api"): {"app": ()}}
    with standin_kubelet(str(sock), pods):
        got = list_pod_resources(str(sock), timeout=5)
    assert got.warning is None and got.source == str(sock)
    assert [(a.namespace, a.pod, a.container, a.device_id) for a in got.assignments] == [
        ("ml", "trainer", "rank0", "GPU-a"),
        ("ml", "trainer", "rank1", "GPU-b"),
        ("ml", "trainer", "rank1", "GPU-c"),
    ]
    assert got.gpu_assignments == got.assignments  # the stand-in's are all nvidia.com/gpu
    assert got.pods == {("ml", "trainer"), ("web", "api")} and got.read  # a pod without devices too


@pytest.mark.parametrize(
    ("resource", "gpu"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/gpu.shared", True),  # time-slicing with renameByDefault: the ids are GPU-<uuid>::<n>
        ("nvidia.com/hostdev", False),  # an NVIDIA NIC (network operator): a PCI address, no GPU
        ("amd.com/gpu", False),  # a GPU, not one NVML reads
    ],
)
def test_only_nvidia_gpu_resources_are_gpu_assignments(resource, gpu):
    """gpu_assignments asks k8s.podspec.gpus.gpu_resource, as check and the lab do (before: every
    ``nvidia.com/`` name, NICs included)."""
    resources = PodResources("k.sock", (DeviceAssignment("ns", "p", "c", resource, "0000:3b:00.1"),))
    assert bool(resources.gpu_assignments) is gpu


def test_absent_socket_is_no_source_and_no_warning(tmp_path):
    assert list_pod_resources(str(tmp_path / "none.sock")) == PodResources(source=None)
    assert not PodResources(source=None).read


def test_a_kubelet_without_the_service_is_one_warning(tmp_path):
    sock = tmp_path / "k.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # no service: UNIMPLEMENTED
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        got = list_pod_resources(str(sock), timeout=5)
    finally:
        server.stop(0)
    assert got.assignments == () and got.warning is not None
    assert got.warning.startswith("kubelet PodResources: UNIMPLEMENTED") and "\n" not in got.warning


def test_a_silent_kubelet_is_bounded(tmp_path):
    with socket.socket(socket.AF_UNIX) as silent:
        silent.bind(str(tmp_path / "k.sock"))
        silent.listen(8)
        t0 = time.monotonic()
        got = list_pod_resources(str(tmp_path / "k.sock"), timeout=0.5)
        assert time.monotonic() - t0 < 3
    assert got.warning == "kubelet PodResources: DEADLINE_EXCEEDED: no answer in time"


def test_committed_stubs_are_what_make_proto_generates(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) generates the stubs")
    out = tmp_path / "src"
    shutil.copytree(PACKAGE, out / "gpuzombie" / "k8s" / "podresources_v1", ignore=shutil.ignore_patterns("*_pb2*"))
    proto = "gpuzombie/k8s/podresources_v1/api.proto"
    argv = ["-I", str(out), f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", str(out / proto)]
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    for name in GENERATED:
        fresh = (out / "gpuzombie" / "k8s" / "podresources_v1" / name).read_text()
        assert fresh == (PACKAGE / name).read_text(), f"{name} is stale: run make proto"
