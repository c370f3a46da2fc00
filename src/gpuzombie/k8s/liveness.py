"""Which pods still run: the container runtime's sandboxes and containers, cross-checked with the
kubelet's own pod list, asked afresh on every call, never cached.

``k8s.names`` keeps names across scans (a container's name never changes); whether its pod still
runs does, so this asks every time: ``ListPodSandbox`` and ``ListContainers`` of one CRI runtime,
then the kubelet's PodResources ``List``. A process in the cgroup of a pod the runtime no longer
lists, or lists only as not ready (its sandbox stopped, no container of it running), outlived its
pod: a *stale* holder. That verdict kills a workload in ``reap``, so it needs two answers that agree:

* the runtime's: anything short of one (no socket, an error) makes every pod ``unknown``;
* the kubelet's: every pod it names (namespace and name: ``List`` has no UID) must be one the
  runtime lists. A runtime that lacks some is not (only) the kubelet's, a second containerd beside
  it: every pod is ``unknown``, with the count and an example. A not-ready pod whose name the
  kubelet still runs, and no ready sandbox of another UID has, is the kubelet's and not stale.

Without the kubelet's answer (no socket, an error) every pod is ``unknown`` too, unless the caller
trusts the runtime alone (``trust_runtime``, the ``--trust-runtime-without-kubelet`` flag): then a
runtime that lists no pod at all is still refused, as before there was a cross-check.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from gpuzombie.errors import needs_extra
from gpuzombie.k8s.names import CRI_TIMEOUT, DEFAULT_SOCKETS, RuntimeChannel
from gpuzombie.k8s.podresources import DEFAULT_SOCKET as KUBELET_SOCKET
from gpuzombie.k8s.podresources import PodResources, list_pod_resources

if TYPE_CHECKING:
    from gpuzombie.k8s.cri import RuntimeClient

READY = "SANDBOX_READY"
LIVE_CONTAINER_STATES = frozenset({"CONTAINER_RUNNING", "CONTAINER_UNKNOWN"})
"""A container in these may still run its workload (UNKNOWN: the runtime could not tell)."""
TRUST_FLAG = "--trust-runtime-without-kubelet"


class PodState(str, Enum):
    RUNNING = "running"
    """At least one of its sandboxes is ready, a container of it runs, or the kubelet still runs it."""
    NOT_READY = "not_ready"
    """Listed, but every sandbox of it is stopped and no container of it runs (the kubelet stops
    the containers, then the sandbox), and the kubelet no longer runs it."""
    NOT_LISTED = "not_listed"
    """The runtime has no sandbox of it: the pod was removed."""
    UNKNOWN = "unknown"
    """The runtime could not be read (see ``RuntimePods.problem``)."""


@dataclass(frozen=True)
class RuntimePods:
    """The pod UIDs one runtime lists (read after the processes were, for ``trace.stale``)."""

    source: str | None
    """The CRI socket asked; None when there was none."""
    ready: frozenset[str] = frozenset()
    not_ready: frozenset[str] = frozenset()
    runtime: str | None = None
    """The runtime's own name (``Version``: containerd, cri-o, docker); None when it did not say."""
    problem: str | None = None
    """Why no pod can be judged; None when the runtime answered (and the kubelet agreed)."""
    kept: frozenset[str] = frozenset()
    """Of ``not_ready``: the pods that still run, a container of theirs running or the kubelet
    still running them (a pod whose pause died, one the kubelet restarts)."""

    def state(self, pod_uid: str) -> PodState:
        if self.problem is not None:
            return PodState.UNKNOWN
        if pod_uid in self.ready or pod_uid in self.kept:
            return PodState.RUNNING
        return PodState.NOT_READY if pod_uid in self.not_ready else PodState.NOT_LISTED

    def describe(self) -> str:
        """``containerd at /run/containerd/containerd.sock``: for reasons a person reads."""
        return f"{self.runtime or 'the runtime'} at {self.source}"


@dataclass(frozen=True)
class Sandbox:
    """What liveness needs of one ``ListPodSandbox`` item (its metadata, as the kubelet wrote it)."""

    uid: str
    namespace: str
    name: str
    state: str
    live_containers: int = 0
    """Its containers in a state that may still run (``LIVE_CONTAINER_STATES``)."""


def pods_of(sandboxes: Iterable[tuple[str, str]]) -> tuple[frozenset[str], frozenset[str]]:
    """(ready, not ready) pod UIDs from (uid, state) pairs: one ready sandbox makes a pod ready."""
    ready: set[str] = set()
    listed: set[str] = set()
    for uid, state in sandboxes:
        if not uid:
            continue
        listed.add(uid)
        if state == READY:
            ready.add(uid)
    return frozenset(ready), frozenset(listed - ready)


def judge_pods(
    source: str,
    sandboxes: Iterable[Sandbox],
    kubelet: PodResources,
    *,
    kubelet_socket: str | None,
    runtime: str | None = None,
    trust_runtime: bool = False,
) -> RuntimePods:
    """The runtime's pods checked against the kubelet's (``kubelet.pods``, read after them).

    Refused (``problem``): the kubelet names a pod the runtime has no sandbox of, or the kubelet
    could not be read and ``trust_runtime`` is off (with it: a runtime listing no pod at all)."""
    sandboxes = [s for s in sandboxes if s.uid]
    ready, not_ready = pods_of((s.uid, s.state) for s in sandboxes)
    listed = RuntimePods(source=source, ready=ready, not_ready=not_ready, runtime=runtime)
    running = {s.uid for s in sandboxes if s.live_containers}
    if not kubelet.read:
        why = kubelet.warning or f"no PodResources socket at {kubelet_socket}"
        if not trust_runtime:
            return replace(
                listed,
                problem=f"the kubelet's pod list could not be read ({why}): without it a pod another runtime "
                f"runs looks stale ({TRUST_FLAG} judges from the runtime alone)",
            )
        if not sandboxes:
            return replace(
                listed,
                problem=f"{source} lists no pod at all: not the kubelet's runtime, or a node with nothing "
                "running (then nothing can be told apart)",
            )
        return replace(listed, kept=frozenset(running & not_ready))
    missing = sorted(kubelet.pods - {(s.namespace, s.name) for s in sandboxes})
    if missing:
        ns, name = missing[0]
        return replace(
            listed,
            problem=f"the kubelet runs {len(missing)} pod(s) {listed.describe()} has no sandbox of (e.g. "
            f"{ns}/{name}): not the kubelet's runtime (give --cri-socket), or a pod starting (ask again)",
        )
    # A not-ready pod whose name the kubelet runs is its pod, unless a ready sandbox of another UID has
    # that name (a StatefulSet pod recreated under a new UID: the old one's leftovers are stale).
    ready_names = {(s.namespace, s.name) for s in sandboxes if s.uid in ready}
    still_the_kubelets = {s.uid for s in sandboxes if (s.namespace, s.name) in kubelet.pods - ready_names}
    return replace(listed, kept=frozenset((running | still_the_kubelets) & not_ready))


class PodLister(RuntimeChannel):
    """Asks one CRI runtime which pods it runs, and the kubelet which it does (``judge_pods``);
    keeps its runtime channel (and the runtime's name) across calls."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        timeout: float = CRI_TIMEOUT,
        candidates: Iterable[str] = DEFAULT_SOCKETS,
        kubelet_socket: str | None = KUBELET_SOCKET,
        trust_runtime: bool = False,
    ):
        super().__init__(socket_path, timeout=timeout, candidates=candidates)
        self.kubelet_socket = kubelet_socket
        self.trust_runtime = trust_runtime
        self._runtime: str | None = None

    def __enter__(self) -> PodLister:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self) -> RuntimePods:
        path, problem = self.find()
        if problem is not None or path is None:
            return RuntimePods(source=path, problem=problem)
        try:
            from gpuzombie.k8s.cri import CriError, container_state, sandbox_state
        except ImportError as exc:
            return RuntimePods(source=path, problem=needs_extra("the CRI runtime", "node", exc))
        deadline = time.monotonic() + self.timeout

        def left() -> float:
            return max(0.001, deadline - time.monotonic())

        try:
            fresh = not self.connected_to(path)
            client = self._connect(path)
            if fresh:
                self._runtime = self._name(client, deadline)
            listed = client.list_pod_sandboxes(timeout=left())
            containers = client.list_containers(timeout=left())
        except CriError as exc:
            self.close()
            return RuntimePods(source=path, problem=f"{path}: {exc} (limit {self.timeout:g} s)")
        live: dict[str, int] = {}
        for c in containers:
            if container_state(c.state) in LIVE_CONTAINER_STATES:
                live[c.pod_sandbox_id] = live.get(c.pod_sandbox_id, 0) + 1
        sandboxes = [
            Sandbox(s.metadata.uid, s.metadata.namespace, s.metadata.name, sandbox_state(s.state), live.get(s.id, 0))
            for s in listed
        ]
        kubelet = list_pod_resources(self.kubelet_socket, timeout=self.timeout)  # after the runtime: see judge_pods
        return judge_pods(
            path,
            sandboxes,
            kubelet,
            kubelet_socket=self.kubelet_socket,
            runtime=self._runtime,
            trust_runtime=self.trust_runtime,
        )

    @staticmethod
    def _name(client: RuntimeClient, deadline: float) -> str | None:
        """The runtime's name, or None when its Version call fails (the pods are what matters)."""
        from gpuzombie.k8s.cri import CriError

        try:
            return client.version(timeout=max(0.001, deadline - time.monotonic())).runtime_name or None
        except CriError as exc:
            if exc.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                raise
            return None
