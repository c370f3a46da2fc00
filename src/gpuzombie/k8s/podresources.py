"""Which pods the kubelet runs, and which GPUs it gave to their containers: PodResources v1
``List`` over its unix socket.

gRPC through grpcio, on stubs generated from the kubelet's ``podresources/v1`` definition
(``podresources_v1/``, ``make proto``). Anything unexpected (no socket, a refused call, a slow
kubelet, no grpcio installed) gives no pods, no assignments and one warning (none for no socket):
names are a bonus; ``k8s.liveness`` needs the pods, and says so itself when they are missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuzombie.k8s.podspec import gpu_resource

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class DeviceAssignment:
    """One device the kubelet allocated to one container: for NVIDIA resources, an id in one of the
    device plugin's forms (``gpu.deviceids``)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class PodResources:
    source: str | None
    assignments: tuple[DeviceAssignment, ...] = ()
    warning: str | None = None
    pods: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name) of every pod ``List`` named, with devices or without: the pods the kubelet
    runs (kubelets before 1.34, or with KubeletPodResourcesListUseActivePods off: also its
    terminated pods still in the API)."""

    @property
    def read(self) -> bool:
        """The kubelet answered (an answer may name no pod at all)."""
        return self.source is not None and self.warning is None

    @property
    def gpu_assignments(self) -> tuple[DeviceAssignment, ...]:
        """The assignments of NVIDIA GPU resources (``nvidia.com/gpu``, ``nvidia.com/mig-…``,
        ``nvidia.com/gpu.shared``: ``podspec.gpu_resource``): only their ids name GPUs NVML reads
        (another plugin's device ``0`` is no GPU index, an NVIDIA NIC's is a PCI address)."""
        return tuple(a for a in self.assignments if _nvidia_gpu(a.resource))


def _nvidia_gpu(resource: str) -> bool:
    gpu = gpu_resource(resource)
    return gpu is not None and gpu.vendor == "nvidia"


def list_pod_resources(socket_path: str | None = DEFAULT_SOCKET, *, timeout: float = 2.0) -> PodResources:
    """Device assignments from the kubelet, or none with a warning (none and no warning: no socket)."""
    if not socket_path or not os.path.exists(socket_path):
        return PodResources(source=None)
    try:
        import grpc

        from gpuzombie.k8s.podresources_v1 import api_pb2, api_pb2_grpc
        from gpuzombie.k8s.rpc import describe
    except ImportError as exc:
        return PodResources(source=socket_path, warning=f"kubelet PodResources: needs gpuzombie[node] ({exc})")
    with grpc.insecure_channel(f"unix://{socket_path}", options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            response = api_pb2_grpc.PodResourcesListerStub(channel).List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout
            )
        except grpc.RpcError as exc:
            code, details = describe(exc)
            return PodResources(source=socket_path, warning=f"kubelet PodResources: {code}: {details}")
    return PodResources(
        source=socket_path,
        assignments=tuple(
            DeviceAssignment(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
            for pod in response.pod_resources
            for container in pod.containers
            for devices in container.devices
            for device_id in devices.device_ids
        ),
        pods=frozenset((pod.namespace, pod.name) for pod in response.pod_resources),
    )
