"""The container runtime through its CRI socket: ``runtime.v1`` RuntimeService over gRPC.

One client for every CRI runtime (containerd, CRI-O, cri-dockerd), on the maintained stubs of the
PyPI package ``container-runtime-interface-api``. It makes pod sandboxes and containers the way the
kubelet does (its labels, its cgroup parents, its log layout), so a lab or a test on a private
runtime looks to ``trace`` and the exporter like a kubelet-made node. Every call has a deadline and
fails as one ``CriError`` with a one-line message.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1.api_pb2_grpc import RuntimeServiceStub

from gpuzombie.k8s.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID
from gpuzombie.k8s.rpc import describe

KUBELET_LOG_ROOT = "/var/log/pods"
DEFAULT_CALL_TIMEOUT = 10.0
MAX_REPLY_BYTES = 16 * 1024 * 1024
"""The largest reply taken (gRPC's default is 4 MiB, under what a busy node's ListPodSandbox and
ListContainers can reach: every pod's annotations ride along). 16 MiB is the kubelet's own bound on
its CRI client (k8s.io/cri-client, maxMsgSize): a runtime whose replies are larger already breaks
the kubelet. Over it: one CriError (RESOURCE_EXHAUSTED), ids shown, never an unbounded read."""
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


_CONTAINER_STATES = {int(number): name for name, number in pb.ContainerState.items()}
_SANDBOX_STATES = {int(number): name for name, number in pb.PodSandboxState.items()}


def container_state(value: int) -> str:
    """``CONTAINER_RUNNING`` and the like; the number for a state newer than these stubs."""
    return _CONTAINER_STATES.get(value, str(value))


def sandbox_state(value: int) -> str:
    """``SANDBOX_READY`` or ``SANDBOX_NOTREADY``; the number for a state newer than these stubs."""
    return _SANDBOX_STATES.get(value, str(value))


class CriError(Exception):
    """A CRI call failed or ran out of time; the message is one line, ``code`` the gRPC status name."""

    def __init__(self, message: str, code: str = "ERROR"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SandboxSpec:
    """A pod as the kubelet hands it to the runtime: names, UID and QoS class (for its cgroup)."""

    name: str
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    qos: str = "besteffort"
    labels: Mapping[str, str] = field(default_factory=dict)
    share_process_namespace: bool = False
    """``shareProcessNamespace: true``: one PID namespace for the pod, the pause container its PID 1."""
    host_network: bool = True
    """The node's network and UTS namespaces (``hostNetwork: true``, no CNI needed); False: the
    pod's own, which the runtime's CNI configuration sets up, and the pod's name as hostname."""

    def __post_init__(self) -> None:
        if self.qos not in QOS_CLASSES:
            raise ValueError(f"qos {self.qos!r} is not one of {', '.join(QOS_CLASSES)}")

    @property
    def cgroup_parent(self) -> str:
        """The kubelet's cgroupfs-driver parent: ``/kubepods/<qos>/pod<uid>`` (Guaranteed: no qos level)."""
        qos_dir = "" if self.qos == "guaranteed" else f"/{self.qos}"
        return f"/kubepods{qos_dir}/pod{self.uid}"

    @property
    def kubelet_labels(self) -> dict[str, str]:
        """The pod's labels plus the three the kubelet adds to the sandbox and every container."""
        return {**self.labels, POD_NAME: self.name, POD_NAMESPACE: self.namespace, POD_UID: self.uid}


@dataclass(frozen=True)
class BindMount:
    host_path: str
    container_path: str
    readonly: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One container of a pod: image, command (the image's entrypoint when empty), env, mounts."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[BindMount, ...] = ()
    devices: tuple[str, ...] = ()
    """Host device nodes given to the container at the same path (``rwm``), as device plugins do."""
    run_as_user: int | None = None
    """The uid its processes run as (``securityContext.runAsUser``); the image's user when None."""
    run_as_group: int | None = None
    readonly_rootfs: bool = False
    no_new_privs: bool = False
    """``allowPrivilegeEscalation: false``."""
    drop_capabilities: tuple[str, ...] = ()
    seccomp: str | None = None
    """``RuntimeDefault`` or ``Unconfined`` (``securityContext.seccompProfile.type``), as the kubelet
    sends it; None sends none (the runtime's own default)."""
    memory_limit: int | None = None
    """Bytes (``resources.limits.memory``), the container cgroup's limit."""
    cpu_request: float | None = None
    cpu_limit: float | None = None
    """CPUs, as the kubelet turns them into cpu shares and a CFS quota."""


def _namespaces(host_network: bool, share_pid: bool = False) -> pb.NamespaceOption:
    """The kubelet's defaults: a pod-wide IPC namespace, one PID namespace per container (one for
    the pod with shareProcessNamespace)."""
    return pb.NamespaceOption(
        network=pb.NODE if host_network else pb.POD,
        pid=pb.POD if share_pid else pb.CONTAINER,
        ipc=pb.POD,
    )


def sandbox_config(pod: SandboxSpec, *, log_root: str = KUBELET_LOG_ROOT) -> pb.PodSandboxConfig:
    """The PodSandboxConfig the kubelet (cgroupfs driver) sends for ``pod``."""
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0),
        hostname="" if pod.host_network else pod.name[:63].rstrip("-."),  # the kubelet's cut; host network: the node's
        log_directory=f"{log_root}/{pod.namespace}_{pod.name}_{pod.uid}",
        labels=pod.kubelet_labels,
        annotations={"kubernetes.io/config.source": "api", "kubernetes.io/config.seen": "gpuzombie"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=pod.cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=_namespaces(pod.host_network, pod.share_process_namespace)
            ),
        ),
    )


def container_config(pod: SandboxSpec, container: ContainerSpec) -> pb.ContainerConfig:
    """The ContainerConfig the kubelet sends: its four labels, its log path ``<name>/0.log``."""
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=container.name, attempt=0),
        image=pb.ImageSpec(image=container.image),
        command=list(container.command),
        args=list(container.args),
        envs=[pb.KeyValue(key=k, value=v) for k, v in container.env.items()],
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.readonly)
            for m in container.mounts
        ],
        devices=[pb.Device(container_path=d, host_path=d, permissions="rwm") for d in container.devices],
        labels={POD_NAME: pod.name, POD_NAMESPACE: pod.namespace, POD_UID: pod.uid, CONTAINER_NAME: container.name},
        annotations={"io.kubernetes.container.restartCount": "0"},
        log_path=f"{container.name}/0.log",
        linux=pb.LinuxContainerConfig(
            security_context=pb.LinuxContainerSecurityContext(
                namespace_options=_namespaces(pod.host_network, pod.share_process_namespace),
                run_as_user=None if container.run_as_user is None else pb.Int64Value(value=container.run_as_user),
                run_as_group=None if container.run_as_group is None else pb.Int64Value(value=container.run_as_group),
                readonly_rootfs=container.readonly_rootfs,
                no_new_privs=container.no_new_privs,
                capabilities=pb.Capability(drop_capabilities=list(container.drop_capabilities))
                if container.drop_capabilities
                else None,
                seccomp=None
                if container.seccomp is None
                else pb.SecurityProfile(profile_type=pb.SecurityProfile.ProfileType.Value(container.seccomp)),
            ),
            resources=_resources(container),
        ),
    )


CFS_PERIOD_US = 100_000


def _resources(container: ContainerSpec) -> pb.LinuxContainerResources | None:
    """The kubelet's translation: shares = request × 1024 (at least 2), quota = limit × the period."""
    if container.memory_limit is None and container.cpu_request is None and container.cpu_limit is None:
        return None
    request = container.cpu_request if container.cpu_request is not None else container.cpu_limit
    return pb.LinuxContainerResources(
        cpu_shares=max(2, int(request * 1024)) if request is not None else 0,
        cpu_period=CFS_PERIOD_US if container.cpu_limit is not None else 0,
        cpu_quota=max(1000, int(container.cpu_limit * CFS_PERIOD_US)) if container.cpu_limit is not None else 0,
        memory_limit_in_bytes=container.memory_limit or 0,
    )


class RuntimeClient:
    """One gRPC channel to a CRI socket; each method one RuntimeService call with a deadline."""

    def __init__(
        self,
        socket_path: str,
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        log_root: str = KUBELET_LOG_ROOT,
        before_sandbox: Callable[[SandboxSpec], None] | None = None,
    ):
        self.socket_path = socket_path
        self.timeout = timeout
        self.log_root = log_root
        self.before_sandbox = before_sandbox
        """Called with each pod before its RunPodSandbox (a private runtime notes the cgroups it adds)."""
        # No retries on a dead socket and no proxy: fail fast and let the deadline speak.
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[
                ("grpc.enable_retries", 0),
                ("grpc.enable_http_proxy", 0),
                ("grpc.max_receive_message_length", MAX_REPLY_BYTES),
            ],
        )
        self._stub = RuntimeServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RuntimeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as exc:
            code, details = describe(exc)
            raise CriError(f"{method}: {details}", code) from None

    def version(self, *, timeout: float | None = None) -> pb.VersionResponse:
        return self._call("Version", pb.VersionRequest(), timeout)

    def list_pod_sandboxes(self, *, timeout: float | None = None) -> list[pb.PodSandbox]:
        return list(self._call("ListPodSandbox", pb.ListPodSandboxRequest(), timeout).items)

    def list_containers(self, *, timeout: float | None = None) -> list[pb.Container]:
        return list(self._call("ListContainers", pb.ListContainersRequest(), timeout).containers)

    def container_status(
        self, container_id: str, *, verbose: bool = False, timeout: float | None = None
    ) -> pb.ContainerStatusResponse:
        return self._call(
            "ContainerStatus", pb.ContainerStatusRequest(container_id=container_id, verbose=verbose), timeout
        )

    def container_pid(self, container_id: str, *, timeout: float | None = None) -> int:
        """The host pid of the container's PID 1 (containerd and CRI-O put it in the verbose info)."""
        info = self.container_status(container_id, verbose=True, timeout=timeout).info.get("info", "{}")
        try:
            pid = json.loads(info).get("pid")
        except ValueError:
            pid = None
        if not isinstance(pid, int) or pid <= 0:
            raise CriError(f"ContainerStatus: no pid for {container_id[:13]} in the runtime's verbose info")
        return pid

    def run_pod_sandbox(self, pod: SandboxSpec, *, timeout: float | None = None) -> str:
        config = sandbox_config(pod, log_root=self.log_root)
        if self.before_sandbox is not None:
            self.before_sandbox(pod)
        return str(self._call("RunPodSandbox", pb.RunPodSandboxRequest(config=config), timeout).pod_sandbox_id)

    def create_container(
        self, sandbox_id: str, pod: SandboxSpec, container: ContainerSpec, *, timeout: float | None = None
    ) -> str:
        request = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id,
            config=container_config(pod, container),
            sandbox_config=sandbox_config(pod, log_root=self.log_root),
        )
        return str(self._call("CreateContainer", request, timeout).container_id)

    def start_container(self, container_id: str, *, timeout: float | None = None) -> None:
        self._call("StartContainer", pb.StartContainerRequest(container_id=container_id), timeout)

    def exec_sync(self, container_id: str, argv: list[str], *, timeout: float | None = None) -> pb.ExecSyncResponse:
        """Run ``argv`` in the container and wait for it (the runtime's own limit is the call's deadline);
        the runtime's reply (exit_code, stdout, stderr) as it is, like every other call's."""
        limit = self.timeout if timeout is None else timeout
        request = pb.ExecSyncRequest(container_id=container_id, cmd=argv, timeout=max(1, int(limit)))
        return self._call("ExecSync", request, limit + 2)

    def stop_container(self, container_id: str, *, grace: int = 0, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (the kubelet's terminationGracePeriodSeconds)."""
        call_timeout = (self.timeout if timeout is None else timeout) + grace
        self._call("StopContainer", pb.StopContainerRequest(container_id=container_id, timeout=grace), call_timeout)

    def stop_pod_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> None:
        self._call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout)

    def remove_pod_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> None:
        """Remove a stopped sandbox and every container in it."""
        self._call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout)


@dataclass(frozen=True)
class RunningPod:
    """A pod sandbox made through ``client``: start containers in it with ``start``."""

    client: RuntimeClient
    spec: SandboxSpec
    sandbox_id: str

    def start(self, container: ContainerSpec) -> str:
        """Create and start one container; its id."""
        container_id = self.client.create_container(self.sandbox_id, self.spec, container)
        self.client.start_container(container_id)
        return container_id
