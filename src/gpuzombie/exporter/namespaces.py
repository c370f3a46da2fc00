"""Each container's PID namespace judged as observe judges it: PID 1, zombies by parent, orphans,
and whether the kubelet's SIGTERM can end it.

Orphans only mean something per PID namespace (a child of *that* namespace's PID 1 not started by
it), so observe's own functions run on each namespace's procfs as the container mounted it, reached
from the node through ``<procfs>/<host pid of its PID 1>/root/proc`` (what ``nsenter -p -m``
shows). Finding the namespaces costs one readlink per process; each namespace is then read once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from gpuzombie.k8s.cgroup import ContainerRef, parse_cgroup_lines
from gpuzombie.observe.orphans import Orphan, Zombie, find_orphans, find_zombies
from gpuzombie.observe.pid1 import Pid1, Pid1Kind, find_pid1
from gpuzombie.proc.procfs import (
    ProcessTable,
    Procfs,
    parse_cgroup,
    parse_ns_link,
    parse_status,
)

SIGTERM_BIT = 1 << (15 - 1)  # bit N-1 of the SigBlk/SigIgn/SigCgt masks in /proc/<pid>/status


@dataclass(frozen=True)
class SigtermDisposition:
    """What a process does with SIGTERM, from /proc/<pid>/status and wchan; None where unreadable."""

    blocked: bool | None
    ignored: bool | None
    caught: bool | None
    sigwaiting: bool = False
    """Asleep in sigtimedwait/sigwait (wchan ``do_sigtimedwait``). There the kernel shows the waited-for
    signals as unblocked although they are queued to it (tini, dumb-init: measured SigBlk 0 for tini)."""

    @property
    def received_as_init(self) -> bool | None:
        """Does a namespace's PID 1 get the kubelet's SIGTERM? The kernel drops a signal sent to a
        namespace init unless the init catches it, blocks it or waits for it."""
        if self.sigwaiting:
            return True
        if self.blocked is None or self.caught is None:
            return None
        return self.blocked or (self.caught and not self.ignored)


UNKNOWN_DISPOSITION = SigtermDisposition(None, None, None)


def parse_sigterm(status_text: str, wchan: str | None = None) -> SigtermDisposition:
    masks: dict[str, bool] = {}
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigBlk", "SigIgn", "SigCgt"):
            try:
                masks[key] = bool(int(value.strip(), 16) & SIGTERM_BIT)
            except ValueError:
                continue
    return SigtermDisposition(
        masks.get("SigBlk"),
        masks.get("SigIgn"),
        masks.get("SigCgt"),
        sigwaiting=bool(wchan and wchan.startswith("do_sigtimedwait")),
    )


def read_sigterm(view: Procfs, pid: int) -> SigtermDisposition:
    status = _read_text(view.path(pid, "status"))
    return parse_sigterm(status, _read_text(view.path(pid, "wchan"))) if status else UNKNOWN_DISPOSITION


@dataclass(frozen=True)
class MainProcess:
    """The process SIGTERM ends the namespace through: PID 1, or the one child a forwarding init
    started (when it exits, the init exits and the kernel kills the rest)."""

    local_pid: int
    comm: str
    sigterm: SigtermDisposition


@dataclass(frozen=True)
class NamespaceScan:
    """One PID namespace other than the node's, read through its own /proc."""

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


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def pid_namespaces(procfs: Procfs) -> dict[int, int]:
    """Host pid -> PID-namespace inode (one readlink each; vanished or denied pids left out)."""
    found = {}
    for pid in procfs.pids():
        try:
            inode = parse_ns_link(os.readlink(procfs.path(pid, "ns", "pid")))
        except OSError:
            continue
        if inode is not None:
            found[pid] = inode
    return found


def find_init(procfs: Procfs, pids: Iterable[int]) -> int | None:
    """The host pid of the namespace's PID 1: the member whose innermost NSpid is 1 (usually the
    lowest host pid, tried first)."""
    for pid in sorted(pids):
        text = _read_text(procfs.path(pid, "status"))
        if text is not None and parse_status(text).nspid[-1:] == (1,):
            return pid
    return None


def _main_process(view: Procfs, table: ProcessTable, pid1: Pid1) -> MainProcess | None:
    if pid1.kind is not Pid1Kind.INIT:
        return None
    child = min(table.children(1), key=lambda p: (p.start_ticks, p.pid), default=None)
    if child is None:
        return None
    return MainProcess(child.pid, child.comm, read_sigterm(view, child.pid))


def scan_namespace(procfs: Procfs, inode: int, pid1_host: int, *, now: float) -> NamespaceScan | str:
    """One namespace through ``<procfs>/<pid1>/root/proc``; a one-line reason when it cannot be read."""
    view = Procfs(procfs.path(pid1_host, "root", "proc"))
    try:
        table = view.snapshot(now=now, with_cgroup=False)
    except (OSError, ValueError) as exc:
        return f"PID namespace of pid {pid1_host}: its /proc is not readable ({exc})"
    if view.tree_pidns(table.processes) != inode:
        return f"PID namespace of pid {pid1_host}: its root has no /proc of its own namespace"
    pid1 = find_pid1(table)
    if pid1.kind is Pid1Kind.PAUSE and len(table) == 1:
        return ""  # a pod's sandbox without a shared process namespace: nothing to judge
    cgroup = _read_text(procfs.path(pid1_host, "cgroup"))
    return NamespaceScan(
        inode=inode,
        pid1_host_pid=pid1_host,
        container=parse_cgroup_lines(parse_cgroup(cgroup)) if cgroup else None,
        pid1=pid1,
        pid1_sigterm=read_sigterm(view, 1),
        main=_main_process(view, table, pid1),
        processes=len(table),
        zombies=find_zombies(table, pid1, now=now),
        orphans=find_orphans(table, pid1, now=now),
    )


def survey(procfs: Procfs, *, now: float) -> NamespaceSurvey:
    """Every PID namespace below the node's, judged; raises OSError when the procfs cannot be listed."""
    pidns_of = pid_namespaces(procfs)
    node_ns = procfs.tree_pidns(sorted(pidns_of))
    members: dict[int, list[int]] = {}
    for pid, inode in pidns_of.items():
        if inode != node_ns:
            members.setdefault(inode, []).append(pid)
    scans, warnings = [], []
    for inode, pids in sorted(members.items()):
        pid1_host = find_init(procfs, pids)
        if pid1_host is None:
            continue  # its PID 1 exited between the readlinks and now (the namespace is ending)
        result = scan_namespace(procfs, inode, pid1_host, now=now)
        if isinstance(result, NamespaceScan):
            scans.append(result)
        elif result:
            warnings.append(result)
    return NamespaceSurvey(tuple(scans), pidns_of, tuple(warnings))
