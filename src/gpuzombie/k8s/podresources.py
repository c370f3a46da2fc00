"""Which pods the kubelet runs, and which GPUs it gave to their containers: PodResources v1
``List`` over its unix socket, device plugins' devices and DRA's.

A DRA device (``dynamic_resources``: claim, driver, pool, device) names no GPU NVML knows; its CDI
devices do: the CDI spec the driver wrote names the device nodes (``k8s.cdi``), and a
``/dev/nvidiaN`` is NVML's GPU of minor number N. Such a device becomes an assignment of id
``/dev/nvidiaN`` (``gpu.deviceids``) carrying its claim. A DRA device whose CDI devices are in no
spec leaves its pod unresolved (one warning): its holders are not judged foreign.

gRPC through grpcio, on stubs generated from the kubelet's ``podresources/v1`` definition
(``podresources_v1/``, ``make proto``). Anything unexpected (no socket, a refused call, a slow
kubelet, no grpcio installed) gives no pods, no assignments and one warning (none for no socket):
names are a bonus; ``k8s.liveness`` needs the pods, and says so itself when they are missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpuzombie.errors import needs_extra
from gpuzombie.k8s.cdi import DEFAULT_CDI_DIRS, CdiDevices, read_cdi_devices
from gpuzombie.k8s.podspec.gpus import gpu_resource

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class DraClaim:
    """The DRA device behind an assignment, named as dcgm-exporter's ``dra_*`` labels name it."""

    claim_name: str
    claim_namespace: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class Allocation:
    """A container the kubelet gave a device to (what the trace says of each GPU)."""

    namespace: str
    pod: str
    container: str
    claim: DraClaim | None = None
    """The DRA claim and device it was given through; None for a device plugin's."""


@dataclass(frozen=True)
class DeviceAssignment:
    """One device the kubelet allocated to one container: for NVIDIA resources, an id in one of the
    device plugin's forms (``gpu.deviceids``); for a DRA device, its GPU node ``/dev/nvidiaN`` and
    ``claim``."""

    namespace: str
    pod: str
    container: str
    resource: str
    """The device plugin's resource name; a DRA device's driver name."""
    device_id: str
    claim: DraClaim | None = None

    @property
    def allocation(self) -> Allocation:
        """The container it went to and through which claim: one per GPU in the trace, whatever the id's form."""
        return Allocation(self.namespace, self.pod, self.container, self.claim)


@dataclass(frozen=True)
class PodResources:
    source: str | None
    assignments: tuple[DeviceAssignment, ...] = ()
    warning: str | None = None
    pods: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name) of every pod ``List`` named, with devices or without: the pods the kubelet
    runs (kubelets before 1.34, or with KubeletPodResourcesListUseActivePods off: also its
    terminated pods still in the API)."""
    unresolved_dra: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name) of pods with a DRA device no CDI spec resolved: which GPU it is is unknown."""
    dra_warnings: tuple[str, ...] = ()
    """Unreadable CDI specs and unresolved DRA devices: the kubelet did answer (``read`` holds)."""

    @property
    def read(self) -> bool:
        """The kubelet answered (an answer may name no pod at all)."""
        return self.source is not None and self.warning is None

    @property
    def gpu_assignments(self) -> tuple[DeviceAssignment, ...]:
        """The assignments of NVIDIA GPU resources (``nvidia.com/gpu``, ``nvidia.com/mig-…``,
        ``nvidia.com/gpu.shared``: ``podspec.gpus.gpu_resource``): only their ids name GPUs NVML reads
        (another plugin's device ``0`` is no GPU index, an NVIDIA NIC's is a PCI address), and the
        DRA devices whose CDI spec names a GPU node."""
        return tuple(a for a in self.assignments if a.claim is not None or _nvidia_gpu(a.resource))


def _nvidia_gpu(resource: str) -> bool:
    gpu = gpu_resource(resource)
    return gpu is not None and gpu.vendor == "nvidia"


def list_pod_resources(
    socket_path: str | None = DEFAULT_SOCKET, *, timeout: float = 2.0, cdi_dirs: tuple[str, ...] = DEFAULT_CDI_DIRS
) -> PodResources:
    """Device assignments from the kubelet, or none with a warning (none and no warning: no socket).
    DRA devices are resolved through the CDI specs in ``cdi_dirs``, read only when there is one."""
    if not socket_path or not os.path.exists(socket_path):
        return PodResources(source=None)
    try:
        import grpc

        from gpuzombie.k8s.podresources_v1 import api_pb2, api_pb2_grpc
        from gpuzombie.k8s.rpc import describe
    except ImportError as exc:
        return PodResources(source=socket_path, warning=needs_extra("kubelet PodResources", "node", exc))
    with grpc.insecure_channel(f"unix://{socket_path}", options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            response = api_pb2_grpc.PodResourcesListerStub(channel).List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout
            )
        except grpc.RpcError as exc:
            code, details = describe(exc)
            return PodResources(source=socket_path, warning=f"kubelet PodResources: {code}: {details}")
    plugin = [
        DeviceAssignment(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]
    has_dra = any(c.dynamic_resources for pod in response.pod_resources for c in pod.containers)
    dra, unresolved, warnings = _dra_assignments(response, read_cdi_devices(cdi_dirs) if has_dra else CdiDevices())
    return PodResources(
        source=socket_path,
        assignments=(*plugin, *dra),
        pods=frozenset((pod.namespace, pod.name) for pod in response.pod_resources),
        unresolved_dra=unresolved,
        dra_warnings=warnings,
    )


def _dra_assignments(
    response: Any, cdi: CdiDevices
) -> tuple[list[DeviceAssignment], frozenset[tuple[str, str]], tuple[str, ...]]:
    """Each DRA device of each container as one assignment per GPU node its CDI devices inject;
    the pods with a device no spec defines; the warnings (the specs', then the unresolved devices)."""
    found: list[DeviceAssignment] = []
    unresolved: set[tuple[str, str]] = set()
    missing: list[str] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for dr in container.dynamic_resources:
                for res in dr.claim_resources:
                    names = [d.name for d in res.cdi_devices]
                    if not names or any(n not in cdi.gpu_minors for n in names):
                        unresolved.add((pod.namespace, pod.name))
                        missing.append(
                            f"{pod.namespace}/{pod.name} {res.driver_name}/{res.pool_name}/{res.device_name}"
                        )
                        continue
                    claim = DraClaim(dr.claim_name, dr.claim_namespace, res.driver_name, res.pool_name, res.device_name)
                    minors = sorted({m for n in names for m in cdi.gpu_minors[n]})
                    found.extend(
                        DeviceAssignment(
                            pod.namespace, pod.name, container.name, res.driver_name, f"/dev/nvidia{m}", claim
                        )
                        for m in minors
                    )
    warnings = list(cdi.warnings)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        warnings.append(f"DRA devices with no CDI spec (their pods' holders not judged foreign): {shown}")
    return found, frozenset(unresolved), tuple(warnings)
