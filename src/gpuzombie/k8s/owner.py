"""Which pod and container own a process: the one answer trace, top, the exporter, reap and prestop read.

Where a process sits comes from its own files, in this order (``locate``):

1. its cgroup lines (``k8s.cgroup``), when they name a container or a pod;
2. else its PID namespace: the pod of that namespace's PID 1, when PID 1's cgroup names one (a
   process entered into a container's namespace from elsewhere keeps its own cgroup);
3. else, for a zombie inside a container's PID namespace whose namespace link is gone with it,
   its parent's pod.

Its names come from the runtime (``k8s.names``), in this order (``name``): the container's names,
then the pod's (a container the runtime no longer lists still has a pod it lists or remembers);
the pod UID the cgroup path wrote, else the runtime's. The pod's sandbox (pause, which the
runtime names ``POD``) is no container: its container is empty. A container with no name is
shown by its short id; a process whose cgroup could not be read by ``UNREAD_CGROUP``, never as
the host's.

Only the first rule says which cgroup a process is in: ``reap`` signals only processes that
rule puts in a stale pod (``Owner.in_pod_cgroup``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuzombie.k8s.cgroup import ContainerRef, parse_cgroup_lines
from gpuzombie.k8s.labels import SANDBOX_CONTAINER
from gpuzombie.k8s.names import CriNames
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable

UNREAD_CGROUP = "? (cgroup unreadable)"
"""What a process whose cgroup could not be read shows as its container: never "(host)"."""

NamesLookup = Callable[[Iterable[str]], CriNames]
"""The runtime's names for some container ids (``k8s.names.RuntimeNames`` is one)."""


class FoundBy(enum.Enum):
    """Which rule placed a process."""

    CGROUP = "cgroup"
    PID_NAMESPACE = "pid namespace"
    PARENT = "parent"


@dataclass(frozen=True)
class Location:
    """Where a process sits, before any name: its container reference and how it was found."""

    ref: ContainerRef | None
    found_by: FoundBy | None = None
    """None: in no container and no pod (a host process), or its cgroup unread."""
    cgroup_unread: bool = False


NOWHERE = Location(None)


@dataclass(frozen=True)
class PodLabels:
    """The namespace/pod/container labels of a finding: names, as kube-state-metrics and dcgm-exporter
    have them, never a UID in ``pod``; ``pod_uid`` tells a terminating pod from its same-named
    replacement. Empty where unknown (host processes); the short container id where the runtime
    gave no name; container ``UNREAD_CGROUP`` where the cgroup could not be read (a pod's process,
    for all we know: never labelled as the host's)."""

    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    container: str = ""


@dataclass(frozen=True)
class Owner:
    """A process's container and pod, named."""

    location: Location
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    container: str | None = None
    """The runtime's name of its container; None for the pod's sandbox or an unnamed container."""
    sandbox: bool = False
    """In the pod's sandbox (pause): a shared process namespace's, no one container's."""

    @property
    def ref(self) -> ContainerRef | None:
        return self.location.ref

    @property
    def container_id(self) -> str | None:
        return self.ref.container_id if self.ref else None

    @property
    def in_pod_cgroup(self) -> str | None:
        """The pod UID its own cgroup names (rule 1 alone); None otherwise."""
        return self.ref.pod_uid if self.ref and self.location.found_by is FoundBy.CGROUP else None

    @property
    def container_label(self) -> str:
        """The container as a label: its name, else its short id; "" for the sandbox or none."""
        if self.location.cgroup_unread:
            return UNREAD_CGROUP
        if self.sandbox:
            return ""
        return self.container or (self.ref.short_id if self.ref else None) or ""

    @property
    def labels(self) -> PodLabels:
        return PodLabels(self.namespace or "", self.pod or "", self.pod_uid or "", self.container_label)


NOBODY = Owner(NOWHERE)


def name(location: Location, names: CriNames) -> Owner:
    """The owner at ``location``, named by the runtime's ``names`` (the module's name rules)."""
    ref = location.ref
    if ref is None:
        return Owner(location)
    cnames, pnames = names.container(ref.container_id), names.pod(ref.pod_uid)
    sandbox = cnames is not None and cnames.container == SANDBOX_CONTAINER
    return Owner(
        location,
        namespace=(cnames.namespace if cnames else None) or (pnames.namespace if pnames else None),
        pod=(cnames.pod if cnames else None) or (pnames.pod if pnames else None),
        pod_uid=ref.pod_uid or (cnames.pod_uid if cnames else None),
        container=None if sandbox or cnames is None else cnames.container,
        sandbox=sandbox,
    )


def in_cgroup(proc: ProcessInfo) -> Location:
    """Rule 1 alone: where its cgroup lines put it."""
    if not proc.cgroup:
        return Location(None, cgroup_unread=proc.unread("cgroup"))
    ref = parse_cgroup_lines(proc.cgroup)
    return Location(ref, FoundBy.CGROUP) if ref is not None else NOWHERE


def locate(table: ProcessTable) -> dict[int, Location]:
    """Every process of ``table`` located by the module's three rules."""
    own: dict[tuple[tuple[str, ...], bool], Location] = {}

    def by_cgroup(proc: ProcessInfo) -> Location:
        key = (proc.cgroup, not proc.cgroup and proc.unread("cgroup"))
        if key not in own:  # thousands of processes share a handful of cgroups
            own[key] = in_cgroup(proc)
        return own[key]

    pod_of_pidns = {}
    for proc in table:
        if proc.pidns is not None and proc.pidns != table.tree_pidns and proc.innermost_pid == 1:
            ref = by_cgroup(proc).ref
            if ref is not None and ref.pod_uid:
                pod_of_pidns[proc.pidns] = Location(ref, FoundBy.PID_NAMESPACE)
    located = {}
    for proc in table:
        where = by_cgroup(proc)
        if (where.ref is None or not where.ref.pod_uid) and proc.pidns in pod_of_pidns:
            where = pod_of_pidns[proc.pidns]
        located[proc.pid] = where
    for proc in table:
        parent = located.get(proc.ppid)
        if located[proc.pid].ref is None and proc.is_zombie and len(proc.nspid) > 1 and parent and parent.ref:
            located[proc.pid] = Location(parent.ref, FoundBy.PARENT)  # its links are gone: its parent's pod
    return located


@dataclass(frozen=True)
class Owners:
    """Every process's owner in one table, and the runtime's names they were named by."""

    by_pid: Mapping[int, Owner]
    names: CriNames

    def of(self, pid: int | None) -> Owner:
        return self.by_pid.get(pid, NOBODY) if pid is not None else NOBODY


def resolve(table: ProcessTable, names: NamesLookup, *, ask: Iterable[int]) -> Owners:
    """Locate every process of ``table`` and name it; the runtime is asked once, for the containers
    of the processes in ``ask`` (those whose names a report shows)."""
    located = locate(table)
    wanted = {located[pid].ref for pid in ask if pid in located}
    cri = names(sorted({r.container_id for r in wanted if r is not None and r.container_id}))
    named: dict[Location, Owner] = {}
    by_pid = {}
    for pid, where in located.items():
        if where not in named:
            named[where] = name(where, cri)
        by_pid[pid] = named[where]
    return Owners(by_pid, cri)
