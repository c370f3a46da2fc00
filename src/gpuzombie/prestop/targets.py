"""Which processes a preStop hook should stop, and which it must never touch.

Targets: every process of this PID namespace that holds ``/dev/nvidia*`` (every CUDA process does),
every process NVML lists that maps without ambiguity to one of ours, and every orphan (re-parented
to the namespace's PID 1 after its parent exited). Never: PID 1 of this namespace, this process and
its ancestors, zombies (nothing to signal), and anything whose PID namespace is not ours (compared
by the ``/proc/<pid>/ns/pid`` inode): a nested container's processes and, read from a node, other
containers' processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.attribution import GpuProcessRef, ReaderView, Verdict, attribute_processes
from gpuzombie.gpu.nvml import GpuSnapshot
from gpuzombie.prestop.handle import ProcessIdentity
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, parse_ns_link

ROOT_PIDNS_INODE = 0xEFFFFFFC
"""The kernel's fixed inode of the initial PID namespace (PROC_PID_INIT_INO)."""


@dataclass(frozen=True)
class Target:
    pid: int
    start_ticks: int
    comm: str
    command: str
    state: str
    reasons: tuple[str, ...]
    devices: tuple[str, ...] = ()
    gpu_memory: int | None = None
    """Bytes NVML lists for it (summed over GPUs); None when NVML does not list it."""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_ticks)


@dataclass(frozen=True)
class Excluded:
    pid: int
    comm: str
    reason: str


@dataclass(frozen=True)
class PrestopPlan:
    own_pid: int
    own_pidns: int | None
    in_root_pidns: bool
    pid1_command: str | None
    orphans_included: bool
    gpu_available: bool
    gpu_reason: str | None
    targets: tuple[Target, ...]
    excluded: tuple[Excluded, ...]


def own_pid_in(procfs_root: str) -> int:
    """This process's pid as the procfs sees it; the procfs must be our own namespace's."""
    try:
        pid = int(os.readlink(os.path.join(procfs_root, "self")))
    except (OSError, ValueError) as exc:
        raise GpuzombieError(f"cannot read {procfs_root}/self: {exc}", ExitStatus.ERROR) from exc
    return pid


def in_host_pid_namespace(procfs_root: str = "/proc") -> bool:
    """True when this process is in the initial (host) PID namespace."""
    try:
        return parse_ns_link(os.readlink(os.path.join(procfs_root, "self", "ns", "pid"))) == ROOT_PIDNS_INODE
    except OSError:
        return False


def _ancestors(table: ProcessTable, pid: int) -> set[int]:
    seen: set[int] = set()
    proc = table.get(pid)
    while proc is not None and proc.ppid not in seen and proc.ppid > 0:
        seen.add(proc.ppid)
        proc = table.get(proc.ppid)
    return seen


def is_orphan(proc: ProcessInfo) -> bool:
    """Re-parented to PID 1: its parent is PID 1 but it does not lead its own process group.

    A process PID 1 started itself (tini's child, a shell's job under job control) leads its own
    group; one whose parent died keeps the dead parent's group. A shell without job control as
    PID 1 (the seed's ``sleep infinity`` pod) leaves its jobs in its own group, so they count as
    orphans too: in a pod being stopped, that is what we want.
    """
    return proc.ppid == 1 and proc.pid != 1 and proc.pgid != proc.pid


def _nvml_matches(refs: tuple[GpuProcessRef, ...], table: ProcessTable, own_pidns: int | None) -> dict[int, int]:
    """pid -> bytes, for NVML entries that resolve to exactly one process of this namespace."""
    memory: dict[int, int] = {}
    for ref in refs:
        if ref.verdict is not Verdict.LIVE or ref.local_pid is None:
            continue
        candidates = [p for p in table if p.innermost_pid == ref.local_pid and (ref.comm is None or p.comm == ref.comm)]
        if len(candidates) != 1 or candidates[0].pidns != own_pidns:
            continue  # ambiguous, or not ours: the fd scan still finds our own holders
        pid = candidates[0].pid
        memory[pid] = memory.get(pid, 0) + (ref.used_memory or 0)
    return memory


def plan_targets(
    table: ProcessTable, gpus: GpuSnapshot, *, own_pid: int, include_orphans: bool = True, same_cgroup: bool = False
) -> PrestopPlan:
    """Decide targets and exclusions from one snapshot. Pure: reads nothing, signals nothing.

    ``same_cgroup`` keeps to processes in this process's own cgroup: with
    ``shareProcessNamespace: true`` the pod's containers share one PID namespace, and the hook
    should stop only its own container's processes. In the host's PID namespace (a ``hostPID``
    pod, a node shell) it is always on: there the namespace also holds the node's own GPU users
    (nvidia-persistenced, DCGM) and every other hostPID pod, none of which the hook may stop."""
    me = table.get(own_pid)
    own_pidns = me.pidns if me else None
    in_root = own_pidns == ROOT_PIDNS_INODE
    # In the host's namespace PID 1 is the node's init with legitimate children: no orphan sweep.
    orphans_on = include_orphans and not in_root
    own_cgroup_only = same_cgroup or in_root
    view = ReaderView(in_root_pidns=in_root, own_pid=own_pid)
    refs = attribute_processes(table, gpus, view) if gpus.available else ()
    nvml_memory = _nvml_matches(refs, table, own_pidns)
    protected = {1, own_pid} | _ancestors(table, own_pid)

    targets: list[Target] = []
    excluded: list[Excluded] = []
    for proc in table:
        reasons: list[str] = []
        if proc.nvidia_fds:
            reasons.append("holds " + ", ".join(proc.nvidia_fds))
        if proc.pid in nvml_memory:
            reasons.append(f"listed by NVML ({nvml_memory[proc.pid] // (1024 * 1024)} MiB)")
        if orphans_on and is_orphan(proc):
            reasons.append("orphan (re-parented to PID 1)")
        if not reasons:
            continue
        why_not = None
        if proc.pid == 1:
            why_not = "PID 1 of this namespace (the kubelet stops it)"
        elif proc.pid == own_pid:
            why_not = "this process"
        elif proc.pid in protected:
            why_not = "an ancestor of this process"
        elif own_pidns is None or proc.pidns != own_pidns:
            why_not = "in another PID namespace" if proc.pidns else "PID namespace unreadable"
        elif own_cgroup_only and (me is None or not me.cgroup or proc.cgroup != me.cgroup):
            why_not = (
                "in another cgroup (host PID namespace: only this process's own cgroup)"
                if in_root
                else "in another cgroup (another container of the pod)"
            )
        elif proc.is_zombie:
            why_not = "zombie: already exited, nothing to signal (its parent must reap it)"
        if why_not:
            excluded.append(Excluded(proc.pid, proc.comm, why_not))
            continue
        targets.append(
            Target(
                pid=proc.pid,
                start_ticks=proc.start_ticks,
                comm=proc.comm,
                command=proc.command,
                state=proc.state,
                reasons=tuple(reasons),
                devices=proc.nvidia_fds,
                gpu_memory=nvml_memory.get(proc.pid),
            )
        )
    pid1 = table.get(1)
    return PrestopPlan(
        own_pid=own_pid,
        own_pidns=own_pidns,
        in_root_pidns=in_root,
        pid1_command=pid1.command if pid1 else None,
        orphans_included=orphans_on,
        gpu_available=gpus.available,
        gpu_reason=gpus.reason,
        targets=tuple(targets),
        excluded=tuple(excluded),
    )
