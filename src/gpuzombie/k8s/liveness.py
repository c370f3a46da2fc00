"""Which pods the container runtime still runs: one ``ListPodSandbox`` per call, never cached.

``k8s.names`` keeps names across scans (a container's name never changes); whether its pod still
runs does, so this asks every time. A process in the cgroup of a pod the runtime no longer lists,
or lists only as not ready (its sandbox stopped), outlived its pod: a *stale* holder. That verdict
needs an answer from the kubelet's own runtime, so anything short of one (no socket, an error, a
runtime that lists no pod at all, as a second runtime beside the kubelet's would) makes every pod
``unknown``, with the reason: nothing is called stale on a guess.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from gpuzombie.k8s.names import DEFAULT_SOCKETS, DEFAULT_TIMEOUT, RuntimeChannel

if TYPE_CHECKING:
    from gpuzombie.k8s.cri import RuntimeClient

READY = "SANDBOX_READY"


class PodState(str, Enum):
    RUNNING = "running"
    """At least one of its sandboxes is ready."""
    NOT_READY = "not_ready"
    """Listed, but every sandbox of it is stopped (the kubelet stops it after the containers)."""
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
    """Why no pod can be judged; None when the runtime answered."""

    def state(self, pod_uid: str) -> PodState:
        if self.problem is not None:
            return PodState.UNKNOWN
        if pod_uid in self.ready:
            return PodState.RUNNING
        return PodState.NOT_READY if pod_uid in self.not_ready else PodState.NOT_LISTED

    def describe(self) -> str:
        """``containerd at /run/containerd/containerd.sock``: for reasons a person reads."""
        return f"{self.runtime or 'the runtime'} at {self.source}"


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


class PodLister(RuntimeChannel):
    """Asks one CRI runtime which pods it runs; keeps its channel (and the runtime's name) across calls."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        candidates: Iterable[str] = DEFAULT_SOCKETS,
    ):
        super().__init__(socket_path, timeout=timeout, candidates=candidates)
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
            from gpuzombie.k8s.cri import CriError, sandbox_state
        except ImportError as exc:
            return RuntimePods(source=path, problem=f"needs gpuzombie[node] ({exc})")
        deadline = time.monotonic() + self.timeout
        try:
            fresh = not self.connected_to(path)
            client = self._connect(path)
            if fresh:
                self._runtime = self._name(client, deadline)
            sandboxes = client.list_pod_sandboxes(timeout=max(0.001, deadline - time.monotonic()))
        except CriError as exc:
            self.close()
            return RuntimePods(source=path, problem=f"{path}: {exc} (limit {self.timeout:g} s)")
        ready, not_ready = pods_of((s.metadata.uid, sandbox_state(s.state)) for s in sandboxes)
        problem = None
        if not ready and not not_ready:
            problem = (
                f"{path} lists no pod at all: not the kubelet's runtime, or a node with nothing "
                "running (then nothing can be told apart)"
            )
        return RuntimePods(source=path, ready=ready, not_ready=not_ready, runtime=self._runtime, problem=problem)

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
