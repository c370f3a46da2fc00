"""PID namespaces: which one the reader is in and whether it is the host's (the one check every
caller uses), whether a procfs is its own, and each namespace's own view of its processes, built from
the node's procfs alone.

The kernel gives the initial (host) PID namespace a fixed inode number (``PROC_PID_INIT_INO``,
0xEFFFFFFC, since Linux 3.8); ``/proc/<pid>/ns/pid`` names it as ``pid:[<inode>]``. The NSpid chain
cannot tell the two apart: inside a namespace with its own /proc mounted (a container, ``nsenter -p
-m``), NSpid shows one pid just as on the host.

A container controls what it mounts as its /proc, so a namespace's view is never read from
``/proc/<pid>/root/proc``: it is derived from the host's files, where ``NSpid`` (status) gives each
process's pid inside its namespace and ``ns/pid`` which namespace that is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.parse import parse_ns_link
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs, build_table, not_a_procfs, not_mounted_proc

ROOT_PIDNS_INODE = 0xEFFFFFFC
"""The kernel's fixed inode of the initial PID namespace (PROC_PID_INIT_INO)."""
PID_MAX_LIMIT = 4 * 1024 * 1024
"""No pid reaches this (include/linux/threads.h): pids above it stand for leaders whose local pid
cannot be known from the host (they exited; their group lives on)."""


def is_root_pidns(inode: int | None) -> bool:
    """Is this PID-namespace inode the host's? None (unreadable) is not."""
    return inode == ROOT_PIDNS_INODE


def reader_pidns(procfs_root: str = PROCFS) -> int | None:
    """The inode of this process's PID namespace, through ``<procfs_root>/self``; None when unreadable."""
    try:
        return parse_ns_link(os.readlink(os.path.join(procfs_root, "self", "ns", "pid")))
    except OSError:
        return None


def reader_in_root_pidns(procfs_root: str = PROCFS) -> bool:
    """Is this process in the initial (host) PID namespace?

    When the ns/pid link is unreadable, a one-level NSpid is the best remaining evidence.
    """
    inode = reader_pidns(procfs_root)
    if inode is not None:
        return is_root_pidns(inode)
    status = Procfs(procfs_root).status("self")
    return status is None or len(status.nspid) <= 1


def own_pid_in(procfs_root: str = PROCFS) -> int:
    """This process's pid as ``procfs_root`` sees it (os.getpid() only when it is our namespace's).

    For the commands that signal the pids a tree lists: a tree that is no mounted proc filesystem is
    refused (GpuzombieError, exit 2), whatever its ``self`` says."""
    why = not_a_procfs(procfs_root) or not_mounted_proc(procfs_root)
    if why is not None:
        raise GpuzombieError(why, ExitStatus.ERROR)
    try:
        return int(os.readlink(os.path.join(procfs_root, "self")))
    except (OSError, ValueError) as exc:
        raise GpuzombieError(f"cannot read {procfs_root}/self: {exc}", ExitStatus.ERROR) from exc


def is_live_procfs(root: str) -> bool:
    """A kernel procfs (not a test's or a recording's tree): there, reading others' fds needs root."""
    return os.path.exists(os.path.join(root, "self", "status")) and os.path.exists(os.path.join(root, "1"))


def procfs_is_own(root: str) -> bool | None:
    """Is ``root`` the procfs of this process's own PID namespace? None when it is no live procfs.

    In a procfs of another namespace ``self`` names this process by that namespace's pid (an
    ancestor namespace: ``nsenter --pid`` without ``--mount`` keeps the host's /proc), or does
    not exist (a namespace this process cannot see).
    """
    if not is_live_procfs(root):
        return None
    try:
        return os.readlink(os.path.join(root, "self")) == str(os.getpid())
    except OSError:
        return False


@dataclass(frozen=True)
class NamespaceView:
    """One PID namespace's processes as its own /proc would show them, derived from the host's.

    Pids, parent pids, group and session ids are the namespace's own (0 for one outside it, as the
    kernel shows); ``host_pid`` maps each back. A process whose NSpid could not be read has no
    local pid: it is listed in ``table.unread`` by its host pid.
    """

    inode: int
    table: ProcessTable
    host_pid: dict[int, int]
    """Local pid -> host pid."""


def _local_table(host: ProcessTable, inode: int, members: list[ProcessInfo]) -> NamespaceView:
    known = [p for p in members if len(p.nspid) > 1]
    local_of = {p.pid: p.nspid[-1] for p in known}

    def local(host_id: int, *, leader: bool) -> int:
        if host_id in local_of:
            return local_of[host_id]
        if host_id <= 0 or host_id in host.processes or not leader:
            return 0  # outside the namespace (or not read): the kernel shows 0 there
        return PID_MAX_LIMIT + host_id  # a group or session whose leader exited

    processes = {
        local_of[p.pid]: p.relocated(
            pid=local_of[p.pid],
            ppid=local(p.ppid, leader=False),
            pgid=local(p.pgid, leader=True),
            sid=local(p.sid, leader=True),
        )
        for p in known
    }
    table = build_table(
        processes,
        boot_time=host.boot_time,
        taken_at=host.taken_at,
        procfs_root=host.procfs_root,
        unread=tuple(p.pid for p in members if len(p.nspid) <= 1),
        tree_pidns=inode,
    )
    return NamespaceView(inode, table, {v: k for k, v in local_of.items()})


def namespace_views(host: ProcessTable, node_pidns: int | None) -> dict[int, NamespaceView]:
    """Every PID namespace of the host table other than ``node_pidns``, as its own view.

    A namespace's view holds the processes whose own namespace it is; those of a namespace nested
    in it appear in their own view only.
    """
    members: dict[int, list[ProcessInfo]] = {}
    for proc in host:
        if proc.pidns is not None and proc.pidns != node_pidns:
            members.setdefault(proc.pidns, []).append(proc)
    return {inode: _local_table(host, inode, procs) for inode, procs in sorted(members.items())}
