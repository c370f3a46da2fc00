"""Pod, namespace and container names for container ids, from the CRI runtime; never required.

``RuntimeNames`` asks the runtime's CRI socket (``k8s.cri``, gRPC) with two calls for the whole
node, ``ListPodSandbox`` and ``ListContainers``, then ``ContainerStatus`` only for ids those did not
list, all under one deadline per scan. Names never change for a container id, so they are kept
across scans: an exporter scan whose ids are all known asks nothing. The names of pods and
containers the runtime stops listing are kept too, the last ``MAX_REMEMBERED`` of them: a process
that outlives its deleted pod (a stale GPU holder) is still named by the pod's namespace/pod,
which its alert shows, when the agent saw the pod while it ran. Whatever goes wrong (no
socket, not a socket, permission denied, a runtime that never answers or dies mid-scan) gives the
names found so far, ids for the rest, and one warning: a node agent never waits on its runtime.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from gpuzombie.errors import needs_extra
from gpuzombie.k8s.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID, SANDBOX_CONTAINER

if TYPE_CHECKING:  # gRPC is imported at the first scan: names are optional, the node extra too
    from gpuzombie.k8s.cri import RuntimeClient

T = TypeVar("T")
SOCKET_ENV = "GPUZOMBIE_CRI_SOCKET"
DEFAULT_SOCKETS = ("/run/containerd/containerd.sock", "/run/crio/crio.sock", "/var/run/cri-dockerd.sock")
"""crictl's default endpoints, in its order: containerd, CRI-O, cri-dockerd."""
CRI_TIMEOUT = 5.0
MAX_STATUS_CALLS = 16
MAX_REMEMBERED = 1024
"""Pods, and containers, no longer listed whose names are kept (the oldest forgotten first): about 9
times the 110 pods of the fleet benchmark's busy node, so a node's deletions of many hours."""
SHOWN_BY_ID = "pods and containers shown by id"


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
    """The CRI socket that answered (or was asked); None when there was none to ask."""
    containers: Mapping[str, ContainerNames] = field(default_factory=dict)
    pods: Mapping[str, PodNames] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def container(self, container_id: str | None) -> ContainerNames | None:
        return self.containers.get(container_id) if container_id else None

    def pod(self, pod_uid: str | None) -> PodNames | None:
        return self.pods.get(pod_uid) if pod_uid else None


def find_socket(explicit: str | None, candidates: Iterable[str] = DEFAULT_SOCKETS) -> tuple[str | None, str | None]:
    """The socket to ask and why not: the one given, else the first candidate that is a socket."""
    if explicit:
        try:
            mode = os.stat(explicit).st_mode
        except OSError as exc:
            return explicit, f"CRI socket {explicit}: {exc.strerror}"
        if not stat.S_ISSOCK(mode):
            return explicit, f"CRI socket {explicit}: not a socket"
        return explicit, None
    tried = list(candidates)
    for path in tried:
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return path, None
        except OSError:
            continue
    return None, f"no CRI socket ({', '.join(tried)}; give --cri-socket)"


def _container_names(container_id: str, labels: Mapping[str, str], name: str, state: str) -> ContainerNames:
    return ContainerNames(
        container_id=container_id,
        container=labels.get(CONTAINER_NAME) or name or None,
        pod=labels.get(POD_NAME),
        namespace=labels.get(POD_NAMESPACE),
        pod_uid=labels.get(POD_UID),
        state=state,
    )


class RuntimeChannel:
    """One CRI runtime's socket (``socket_path``, else crictl's order) and a channel to it, kept
    across calls; a new one when the socket found changes, or after ``close`` (a failed call)."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        timeout: float = CRI_TIMEOUT,
        candidates: Iterable[str] = DEFAULT_SOCKETS,
    ):
        self.explicit = socket_path
        self.timeout = timeout
        self.candidates = tuple(candidates)
        self._client: RuntimeClient | None = None

    def find(self) -> tuple[str | None, str | None]:
        """(socket, None), or (None or the socket, the one-line reason none can be asked)."""
        return find_socket(self.explicit, self.candidates)

    def connected_to(self, path: str) -> bool:
        return self._client is not None and self._client.socket_path == path

    def _connect(self, path: str) -> RuntimeClient:
        from gpuzombie.k8s.cri import RuntimeClient

        if self._client is None or self._client.socket_path != path:
            self.close()
            self._client = RuntimeClient(path, timeout=self.timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class RuntimeNames(RuntimeChannel):
    """Names from one CRI runtime, remembered across scans (call it with the ids a scan found)."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        timeout: float = CRI_TIMEOUT,
        candidates: Iterable[str] = DEFAULT_SOCKETS,
    ):
        super().__init__(socket_path, timeout=timeout, candidates=candidates)
        self._containers: dict[str, ContainerNames] = {}
        self._pods: dict[str, PodNames] = {}
        self._unknown: set[str] = set()
        self._gone_containers: OrderedDict[str, ContainerNames] = OrderedDict()
        self._gone_pods: OrderedDict[str, PodNames] = OrderedDict()
        """Names the runtime gave and no longer lists, in the order they went (``MAX_REMEMBERED``)."""
        self._answered: str | None = None
        """The socket whose runtime gave the kept names."""
        self._lock = threading.Lock()

    def __call__(self, container_ids: Iterable[str]) -> CriNames:
        with self._lock:
            return self._scan(set(container_ids))

    def _names(self, source: str | None, wanted: set[str], warnings: list[str]) -> CriNames:
        self._unknown &= wanted  # forget ids no longer seen; keep the others' names
        containers = {cid: self._containers.get(cid) or self._gone_containers.get(cid) for cid in wanted}
        # Every sandbox the list calls named, wanted or not: a pause process is then the pod's sandbox
        # (no container), never a container shown by its short id (top lists every pod process).
        sandboxes = {cid: n for cid, n in self._containers.items() if n.container == SANDBOX_CONTAINER}
        return CriNames(
            source=source,
            containers={**sandboxes, **{cid: n for cid, n in containers.items() if n is not None}},
            pods={**self._gone_pods, **self._pods},
            warnings=tuple(warnings),
        )

    def _scan(self, wanted: set[str]) -> CriNames:
        if self._containers and not wanted - self._containers.keys() - self._gone_containers.keys() - self._unknown:
            return self._names(self._answered, wanted, [])
        path, problem = self.find()
        if problem is not None or path is None:
            return self._names(path, wanted, [f"{problem}: {SHOWN_BY_ID}"])
        try:
            from gpuzombie.k8s.cri import CriError
        except ImportError as exc:
            return self._names(path, wanted, [f"{needs_extra('CRI', 'node', exc)}: {SHOWN_BY_ID}"])
        warnings: list[str] = []
        deadline = time.monotonic() + self.timeout
        try:
            self._ask(self._connect(path), wanted, deadline, warnings)
        except CriError as exc:
            self.close()  # a new channel next scan: no reconnect backoff after a runtime restart
            warnings.insert(0, f"CRI {path}: {exc} (limit {self.timeout:g} s): {SHOWN_BY_ID}")
        return self._names(path, wanted, warnings)

    def _ask(self, client: RuntimeClient, wanted: set[str], deadline: float, warnings: list[str]) -> None:
        """The two list calls, then ContainerStatus for what they missed; raises CriError."""
        from gpuzombie.k8s.cri import CriError, container_state, sandbox_state

        def left() -> float:
            return max(0.001, deadline - time.monotonic())

        sandboxes = client.list_pod_sandboxes(timeout=left())
        containers = client.list_containers(timeout=left())
        fresh: dict[str, ContainerNames] = {}
        pods: dict[str, PodNames] = {}
        for s in sandboxes:
            meta = s.metadata
            fresh[s.id] = ContainerNames(
                s.id, SANDBOX_CONTAINER, meta.name, meta.namespace, meta.uid, sandbox_state(s.state)
            )
            if meta.uid and meta.name:
                pods[meta.uid] = PodNames(meta.uid, meta.name, meta.namespace or None)
        for c in containers:
            fresh[c.id] = _container_names(c.id, c.labels, c.metadata.name, container_state(c.state))
        _remember(self._gone_containers, {cid: n for cid, n in self._containers.items() if cid not in fresh})
        _remember(self._gone_pods, {uid: n for uid, n in self._pods.items() if uid not in pods})
        self._containers, self._pods = fresh, pods  # the node as it is now: bounded by its size
        self._answered = client.socket_path
        missing = sorted(wanted - fresh.keys() - self._gone_containers.keys() - self._unknown)
        unknown = []
        for cid in missing[:MAX_STATUS_CALLS]:
            try:
                status = client.container_status(cid, timeout=left()).status
            except CriError as exc:
                if exc.code != "NOT_FOUND":
                    raise
                self._unknown.add(cid)
                unknown.append(cid[:13])
                continue
            self._containers[cid] = _container_names(
                cid, status.labels, status.metadata.name, container_state(status.state)
            )
        if unknown or len(missing) > MAX_STATUS_CALLS:
            warnings.append(
                f"CRI: {len(missing) - len(missing[:MAX_STATUS_CALLS]) + len(unknown)} container(s) unknown to the CRI "
                f"runtime (e.g. {', '.join(unknown[:3])}): shown by id"
            )


def _remember(kept: OrderedDict[str, T], gone: Mapping[str, T]) -> None:
    """Add the names that ``gone`` from the runtime's lists to ``kept``, forgetting the oldest past
    ``MAX_REMEMBERED``."""
    for key, names in gone.items():
        kept[key] = names
        kept.move_to_end(key)
    while len(kept) > MAX_REMEMBERED:
        kept.popitem(last=False)
