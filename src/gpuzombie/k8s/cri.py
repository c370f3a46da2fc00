"""The container runtime through its CRI socket: ``runtime.v1`` RuntimeService over gRPC.

One client for every CRI runtime (containerd, CRI-O, cri-dockerd), on the maintained stubs of the
PyPI package ``container-runtime-interface-api``. It makes pod sandboxes and containers the way the
kubelet does (its labels, its cgroup parents, its log layout), so a lab or a test on a private
runtime looks to ``trace`` and the exporter like a kubelet-made node. Every call has a deadline and
fails as one ``CriError`` with a one-line message.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1.api_pb2_grpc import RuntimeServiceStub

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
KUBELET_LOG_ROOT = "/var/log/pods"
DEFAULT_CALL_TIMEOUT = 10.0
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
DEFAULT_TIMEOUT = 5.0
MAX_SINGLE_INSPECTS = 16


class CriError(Exception):
    """A CRI call failed or ran out of time; the message is one line."""


@dataclass(frozen=True)
class PodSpec:
    """A pod as the kubelet hands it to the runtime: names, UID and QoS class (for its cgroup)."""

    name: str
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    qos: str = "besteffort"
    labels: Mapping[str, str] = field(default_factory=dict)

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


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


def _one_line(method: str, exc: grpc.RpcError) -> CriError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    name = code.name if code is not None else "ERROR"
    return CriError(f"{method}: {name}: {' '.join(details.split())[:300]}")


def _namespaces(host_network: bool) -> pb.NamespaceOption:
    """The kubelet's defaults: a pod-wide IPC namespace, one PID namespace per container."""
    return pb.NamespaceOption(
        network=pb.NODE if host_network else pb.POD,
        pid=pb.CONTAINER,
        ipc=pb.POD,
    )


def sandbox_config(pod: PodSpec, *, log_root: str = KUBELET_LOG_ROOT, host_network: bool = True) -> pb.PodSandboxConfig:
    """The PodSandboxConfig the kubelet (cgroupfs driver) sends for ``pod``."""
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0),
        hostname="" if host_network else pod.name,  # a host-network pod has the node's UTS namespace
        log_directory=f"{log_root}/{pod.namespace}_{pod.name}_{pod.uid}",
        labels=pod.kubelet_labels,
        annotations={"kubernetes.io/config.source": "api", "kubernetes.io/config.seen": "gpuzombie"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=pod.cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=_namespaces(host_network)),
        ),
    )


def container_config(pod: PodSpec, container: ContainerSpec, *, host_network: bool = True) -> pb.ContainerConfig:
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
        labels={POD_NAME: pod.name, POD_NAMESPACE: pod.namespace, POD_UID: pod.uid, CONTAINER_NAME: container.name},
        annotations={"io.kubernetes.container.restartCount": "0"},
        log_path=f"{container.name}/0.log",
        linux=pb.LinuxContainerConfig(
            security_context=pb.LinuxContainerSecurityContext(namespace_options=_namespaces(host_network)),
        ),
    )


class RuntimeClient:
    """One gRPC channel to a CRI socket; each method one RuntimeService call with a deadline."""

    def __init__(self, socket_path: str, *, timeout: float = DEFAULT_CALL_TIMEOUT, log_root: str = KUBELET_LOG_ROOT):
        self.socket_path = socket_path
        self.timeout = timeout
        self.log_root = log_root
        # No retries on a dead socket and no proxy: fail fast and let the deadline speak.
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.enable_retries", 0), ("grpc.enable_http_proxy", 0)]
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
            raise _one_line(method, exc) from None

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

    def run_pod_sandbox(self, pod: PodSpec, *, timeout: float | None = None) -> str:
        config = sandbox_config(pod, log_root=self.log_root)
        return str(self._call("RunPodSandbox", pb.RunPodSandboxRequest(config=config), timeout).pod_sandbox_id)

    def create_container(
        self, sandbox_id: str, pod: PodSpec, container: ContainerSpec, *, timeout: float | None = None
    ) -> str:
        request = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id,
            config=container_config(pod, container),
            sandbox_config=sandbox_config(pod, log_root=self.log_root),
        )
        return str(self._call("CreateContainer", request, timeout).container_id)

    def start_container(self, container_id: str, *, timeout: float | None = None) -> None:
        self._call("StartContainer", pb.StartContainerRequest(container_id=container_id), timeout)

    def exec_sync(self, container_id: str, argv: list[str], *, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` in the container and wait for it (the runtime's own limit is the call's deadline)."""
        limit = self.timeout if timeout is None else timeout
        request = pb.ExecSyncRequest(container_id=container_id, cmd=argv, timeout=max(1, int(limit)))
        response = self._call("ExecSync", request, limit + 2)
        return ExecResult(exit_code=response.exit_code, stdout=response.stdout, stderr=response.stderr)

    def stop_container(self, container_id: str, *, grace: int = 0, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (the kubelet's terminationGracePeriodSeconds)."""
        call_timeout = (self.timeout if timeout is None else timeout) + grace
        self._call("StopContainer", pb.StopContainerRequest(container_id=container_id, timeout=grace), call_timeout)

    def remove_container(self, container_id: str, *, timeout: float | None = None) -> None:
        self._call("RemoveContainer", pb.RemoveContainerRequest(container_id=container_id), timeout)

    def stop_pod_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> None:
        self._call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout)

    def remove_pod_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> None:
        """Remove a stopped sandbox and every container in it."""
        self._call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout)


@dataclass(frozen=True)
class RunningPod:
    """A pod sandbox made through ``client``: start containers in it with ``start``."""

    client: RuntimeClient
    spec: PodSpec
    sandbox_id: str

    def start(self, container: ContainerSpec) -> str:
        """Create and start one container; its id."""
        container_id = self.client.create_container(self.sandbox_id, self.spec, container)
        self.client.start_container(container_id)
        return container_id


# --- names (through crictl until the gRPC lookup replaces it) ---


@dataclass(frozen=True)
class ContainerNames:
    """What the runtime says about one container (or pod sandbox, named "POD")."""

    container_id: str
    container: str | None
    pod: str | None
    namespace: str | None
    pod_uid: str | None
    state: str | None


@dataclass(frozen=True)
class PodNames:
    pod_uid: str
    pod: str
    namespace: str | None


@dataclass(frozen=True)
class CriNames:
    """Every name the runtime gave, keyed by full container id and by pod UID."""

    source: str | None
    containers: Mapping[str, ContainerNames] = field(default_factory=dict)
    pods: Mapping[str, PodNames] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def container(self, container_id: str | None) -> ContainerNames | None:
        return self.containers.get(container_id) if container_id else None

    def pod(self, pod_uid: str | None) -> PodNames | None:
        return self.pods.get(pod_uid) if pod_uid else None


class CrictlFailed(Exception):
    """One crictl call failed or ran out of time; the message is one line."""


def _run(argv: list[str], deadline: float) -> str:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise CrictlFailed(f"no time left for {' '.join(argv[1:3])}")
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:
        raise CrictlFailed(f"cannot run {argv[0]}: {exc.strerror}") from exc
    try:
        out, err = proc.communicate(timeout=remaining)
    except subprocess.TimeoutExpired:
        # Its own session: kill what it started too, or a child holding the pipe keeps us waiting.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise CrictlFailed(f"'{' '.join(argv[1:3])}' timed out") from None
    if proc.returncode != 0:
        first = (err.decode(errors="replace").strip().splitlines() or [""])[0][:200]
        raise CrictlFailed(f"'{' '.join(argv[1:3])}' exited {proc.returncode}: {first}")
    return out.decode(errors="replace")


def _json_documents(text: str) -> list[Any]:
    """crictl prints one JSON document per inspected id (newer versions: one list)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = decoder.raw_decode(text, i)
        docs.extend(doc if isinstance(doc, list) else [doc])


def _container(item: Mapping[str, Any]) -> ContainerNames:
    labels = item.get("labels") or {}
    meta = item.get("metadata") or {}
    return ContainerNames(
        container_id=item.get("id", ""),
        container=labels.get(CONTAINER_NAME) or meta.get("name"),
        pod=labels.get(POD_NAME),
        namespace=labels.get(POD_NAMESPACE),
        pod_uid=labels.get(POD_UID),
        state=item.get("state"),
    )


def parse_ps(text: str) -> list[ContainerNames]:
    """``crictl ps -a -o json``."""
    return [_container(c) for c in json.loads(text).get("containers") or ()]


def parse_pods(text: str) -> tuple[list[PodNames], list[ContainerNames]]:
    """``crictl pods -o json``: the pods, and their sandboxes as containers named "POD"."""
    pods, sandboxes = [], []
    for item in json.loads(text).get("items") or ():
        meta = item.get("metadata") or {}
        uid, name, ns = meta.get("uid"), meta.get("name"), meta.get("namespace")
        if uid and name:
            pods.append(PodNames(pod_uid=uid, pod=name, namespace=ns))
        sandboxes.append(
            ContainerNames(
                container_id=item.get("id", ""),
                container="POD",
                pod=name,
                namespace=ns,
                pod_uid=uid,
                state=item.get("state"),
            )
        )
    return pods, sandboxes


def parse_inspect(text: str) -> list[ContainerNames]:
    """``crictl inspect -o json ID...``: the ``status`` part of each document."""
    return [_container(d.get("status") or {}) for d in _json_documents(text) if isinstance(d, dict)]


def _inspect(exe: str, ids: list[str], deadline: float, warnings: list[str]) -> list[ContainerNames]:
    """Ids ``ps -a`` did not list (created since, or not the CRI's): one call for all; if one id
    is unknown crictl fails them all, so then one call each, at most MAX_SINGLE_INSPECTS."""
    try:
        return parse_inspect(_run([exe, "inspect", "-o", "json", *ids], deadline))
    except CrictlFailed as exc:
        if len(ids) == 1:
            warnings.append(f"crictl: {exc}")
            return []
    found: list[ContainerNames] = []
    unknown = []
    for cid in ids[:MAX_SINGLE_INSPECTS]:
        try:
            found.extend(parse_inspect(_run([exe, "inspect", "-o", "json", cid], deadline)))
        except CrictlFailed:
            unknown.append(cid[:13])
    if unknown or len(ids) > MAX_SINGLE_INSPECTS:
        warnings.append(
            f"crictl: {len(ids) - len(found)} container(s) unknown to the CRI runtime "
            f"(e.g. {', '.join(unknown[:3])}): shown by id"
        )
    return found


def find_crictl(path: str | None) -> str | None:
    return path if path else shutil.which("crictl")


def lookup(crictl: str | None, container_ids: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT) -> CriNames:
    """Names for ``container_ids`` (and every pod) from ``crictl``; ids only plus a warning on failure."""
    exe = find_crictl(crictl)
    if exe is None:
        return CriNames(source=None, warnings=("crictl not found: pods and containers shown by id",))
    deadline = time.monotonic() + timeout
    containers: dict[str, ContainerNames] = {}
    pods: dict[str, PodNames] = {}
    warnings: list[str] = []
    wanted = sorted(set(container_ids))
    try:
        for c in parse_ps(_run([exe, "ps", "-a", "-o", "json"], deadline)):
            containers[c.container_id] = c
        pod_list, sandboxes = parse_pods(_run([exe, "pods", "-o", "json"], deadline))
        pods.update((p.pod_uid, p) for p in pod_list)
        for s in sandboxes:
            containers.setdefault(s.container_id, s)
        missing = [cid for cid in wanted if cid not in containers]
        if missing:
            containers.update((c.container_id, c) for c in _inspect(exe, missing, deadline, warnings))
    except CrictlFailed as exc:
        warnings.append(f"crictl: {exc}; showing ids for what it did not name (limit {timeout:g} s)")
    except (ValueError, AttributeError) as exc:
        warnings.append(f"crictl: unreadable output ({exc}); showing ids")
    return CriNames(source=exe, containers=containers, pods=pods, warnings=tuple(warnings))
