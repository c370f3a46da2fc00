"""Each container's PID namespace judged as observe judges it: PID 1, zombies by parent, orphans,
and whether the kubelet's SIGTERM can end it.

Orphans only mean something per PID namespace (a child of *that* namespace's PID 1 not started by
it), so observe's own functions run on each namespace's view. The view is derived from the node's
own procfs (``gpuzombie.proc.pidns.namespace_views``: NSpid gives each process's pid inside its
namespace), never read from the namespace's /proc, which the container mounts and controls.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuzombie.k8s.cgroup import ContainerRef, parse_cgroup_lines
from gpuzombie.observe.orphans import Orphan, Zombie, find_orphans, find_zombies
from gpuzombie.observe.pid1 import Pid1, find_pid1
from gpuzombie.pid1kinds import Pid1Kind
from gpuzombie.proc.parse import SigtermDisposition
from gpuzombie.proc.pidns import NamespaceView, namespace_views
from gpuzombie.proc.procfs import ProcessTable, Procfs


@dataclass(frozen=True)
class MainProcess:
    """The process SIGTERM ends the namespace through: PID 1, or the one child a forwarding init
    started (when it exits, the init exits and the kernel kills the rest)."""

    local_pid: int
    comm: str
    sigterm: SigtermDisposition


@dataclass(frozen=True)
class NamespaceScan:
    """One PID namespace other than the node's, judged from the node's procfs."""

    inode: int
    pid1_host_pid: int
    container: ContainerRef | None
    """From PID 1's cgroup: the container (or, for a shared process namespace, the pod sandbox)."""
    pid1: Pid1
    pid1_sigterm: SigtermDisposition
    main: MainProcess | None
    """The forwarding init's child; None when PID 1 is the main process (or has no child)."""
    processes: int
    zombies: tuple[Zombie, ...]
    orphans: tuple[Orphan, ...]
    unverified: int = 0
    """Its processes that could not be read where that could hide a zombie or an orphan."""
    cgroup_unread: bool = False
    """PID 1's cgroup could not be read: ``container`` is unknown, not absent."""

    @property
    def grace_risk(self) -> str | None:
        """Why a deletion would keep this namespace alive for the whole grace period, or None.

        ``pid1_drops_sigterm``: PID 1 neither catches, blocks nor waits for SIGTERM, so the kernel
        drops the kubelet's signal (a ``sleep`` or bash PID 1, a python PID 1 without a handler).
        A forwarding init (tini, dumb-init, ...) is taken at its word.
        ``main_ignores_sigterm``: a forwarding init passes it on, but the child it started ignores
        it. A process that catches SIGTERM is trusted to act on it (its handler cannot be read).
        """
        if self.pid1.kind is Pid1Kind.PAUSE:
            return None  # pause exits on SIGTERM
        if self.pid1.kind is not Pid1Kind.INIT and self.pid1_sigterm.received_as_init is False:
            return "pid1_drops_sigterm"
        if self.main is not None and self.main.sigterm.ignored and not self.main.sigterm.blocked:
            return "main_ignores_sigterm"
        return None


@dataclass(frozen=True)
class NamespaceSurvey:
    namespaces: tuple[NamespaceScan, ...]
    pidns_of: dict[int, int]
    """Host pid -> PID-namespace inode, for every process whose link was readable."""
    warnings: tuple[str, ...]


def _main_process(procfs: Procfs, view: NamespaceView, pid1: Pid1) -> MainProcess | None:
    if pid1.kind is not Pid1Kind.INIT:
        return None
    child = min(view.table.children(1), key=lambda p: (p.start_ticks, p.pid), default=None)
    if child is None:
        return None
    return MainProcess(child.pid, child.comm, procfs.sigterm(view.host_pid[child.pid]))


def scan_namespace(procfs: Procfs, view: NamespaceView, *, now: float) -> NamespaceScan | str:
    """One namespace from its view; a one-line reason when it cannot be judged ("" to skip it)."""
    table = view.table
    init = table.get(1)
    if init is None:
        if table.unread:
            return f"PID namespace {view.inode}: its processes' NSpid could not be read (pids {list(table.unread)[:5]})"
        return ""  # its PID 1 exited between the listing and now (the namespace is ending)
    pid1 = find_pid1(table)
    if pid1.kind is Pid1Kind.PAUSE and len(table) == 1:
        return ""  # a pod's sandbox without a shared process namespace: nothing to judge
    pid1_host = view.host_pid[1]
    return NamespaceScan(
        inode=view.inode,
        pid1_host_pid=pid1_host,
        container=None if init.unread("cgroup") else parse_cgroup_lines(init.cgroup),
        pid1=pid1,
        pid1_sigterm=procfs.sigterm(pid1_host),
        main=_main_process(procfs, view, pid1),
        processes=len(table),
        zombies=find_zombies(table, pid1, now=now),
        orphans=find_orphans(table, pid1, now=now),
        unverified=len(table.unverified((1,))) + len(table.unread),
        cgroup_unread=init.unread("cgroup"),
    )


def survey(procfs: Procfs, host: ProcessTable, *, now: float) -> NamespaceSurvey:
    """Every PID namespace below the node's in the node's table ``host`` (read with cgroups), judged."""
    pidns_of = {p.pid: p.pidns for p in host if p.pidns is not None}
    scans, warnings = [], []
    for view in namespace_views(host, host.tree_pidns).values():
        result = scan_namespace(procfs, view, now=now)
        if isinstance(result, NamespaceScan):
            scans.append(result)
        elif result:
            warnings.append(result)
    return NamespaceSurvey(tuple(scans), pidns_of, tuple(warnings))
