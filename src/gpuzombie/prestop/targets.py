"""Which processes a preStop hook should stop, and which it must never touch.

Targets: every process in scope that holds ``/dev/nvidia*`` (every CUDA process does), every process
NVML lists that maps without ambiguity to one in scope, and every orphan by observe's rule (the
evidence that a child of PID 1 was re-parented to it; "cannot tell" is left alone). In scope means:
inside a pod, this PID namespace (compared by the ``/proc/<pid>/ns/pid`` inode); in the host's PID
namespace, only the cgroup or container named on the command line, else nothing at all (refused).
Never: PID 1 of this namespace (or, from the host, of any namespace), this process and its
ancestors, zombies (nothing to signal). A process that could be in scope but could not be read is
no target: it is counted as unread, so the report cannot claim it saw everything.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.attribution import GpuProcessRef, ProcessVerdict, ReaderView, attribute_processes
from gpuzombie.gpu.nvml import GpuSnapshot
from gpuzombie.observe.orphans import CANNOT_TELL, Orphan, find_orphans
from gpuzombie.observe.pid1 import find_pid1
from gpuzombie.prestop.scope import Scope
from gpuzombie.proc.pidfd import ProcessIdentity
from gpuzombie.proc.pidns import is_root_pidns
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable
from gpuzombie.units import MIB


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

    @classmethod
    def of(cls, proc: ProcessInfo, reasons: list[str], gpu_memory: int | None) -> Target:
        """A process read from procfs, with why it is a target and what NVML lists for it."""
        return cls(
            pid=proc.pid,
            start_ticks=proc.start_ticks,
            comm=proc.comm,
            command=proc.command,
            state=proc.state,
            reasons=tuple(reasons),
            devices=proc.nvidia_fds,
            gpu_memory=gpu_memory,
        )


@dataclass(frozen=True)
class Untargeted:
    """A process a plan names and never signals, and why: one a rule excludes (``excluded``), or one
    that could be in scope and was not (fully) read (``unread``: always reported)."""

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
    scope: str | None
    scope_matched: int | None
    """How many processes the scope matched (None without one): 0 usually means a mistyped scope."""
    gpu_available: bool
    gpu_reason: str | None
    targets: tuple[Target, ...]
    excluded: tuple[Untargeted, ...]
    unread: tuple[Untargeted, ...]


def require_scope(own_pidns: int | None, scope: Scope | None) -> None:
    """In the host's PID namespace (or one that cannot be read) act only on an explicit scope."""
    if scope is None and (own_pidns is None or is_root_pidns(own_pidns)):
        where = "a PID namespace that cannot be read" if own_pidns is None else "the host's PID namespace"
        raise GpuzombieError(
            f"refusing to run in {where} without a scope: name the workload with --cgroup PATH or "
            "--container ID (or run it inside the pod, as a preStop hook does)",
            ExitStatus.ERROR,
        )


def _nvml_matches(
    refs: tuple[GpuProcessRef, ...], table: ProcessTable, own_pidns: int | None, in_root: bool
) -> dict[int, int]:
    """pid -> bytes, for NVML entries that resolve to exactly one process we may stop.

    From the host NVML's pid is the procfs pid; inside a pod it is matched by local pid and name
    and kept only when unambiguous and in this namespace (the fd scan still finds our holders)."""
    memory: dict[int, int] = {}
    for ref in refs:
        if ref.verdict is not ProcessVerdict.LIVE:
            continue
        if in_root:
            pid = ref.reader_pid
        else:
            candidates = [
                p for p in table if p.innermost_pid == ref.local_pid and (ref.comm is None or p.comm == ref.comm)
            ]
            ours = len(candidates) == 1 and candidates[0].pidns == own_pidns
            pid = candidates[0].pid if ours else None
        if pid is not None:
            memory[pid] = memory.get(pid, 0) + (ref.used_memory or 0)
    return memory


@dataclass(frozen=True)
class _Rules:
    """Where this hook stands, and what it may touch from there."""

    own_pid: int
    me: ProcessInfo | None
    in_root: bool
    protected: frozenset[int]
    scope: Scope | None
    same_cgroup: bool

    @property
    def own_cgroup(self) -> tuple[str, ...]:
        return self.me.cgroup if self.me else ()

    def outside(self, proc: ProcessInfo) -> str | None:
        """Why ``proc`` is certainly not ours to stop; None when it may be."""
        if proc.pid == 1:
            return "PID 1 of this namespace (the kubelet stops it)"
        if proc.pid == self.own_pid:
            return "this process"
        if proc.pid in self.protected:
            return "an ancestor of this process"
        if proc.is_zombie:
            return "zombie: already exited, nothing to signal (its parent must reap it)"
        if self.in_root and len(proc.nspid) > 1 and proc.innermost_pid == 1:
            return "PID 1 of its container's PID namespace (its runtime stops it)"
        own_pidns = self.me.pidns if self.me else None
        if not self.in_root and proc.pidns is not None and proc.pidns != own_pidns:
            return "in another PID namespace"
        if self.scope is not None and self.scope.contains(proc) is False:
            return f"outside the scope ({self.scope.describe()})"
        if self.same_cgroup and proc.cgroup and self.own_cgroup and proc.cgroup != self.own_cgroup:
            return "in another cgroup (another container of the pod)"
        return None

    def unknown(self, proc: ProcessInfo) -> str | None:
        """Why it cannot be told whether ``proc`` is in scope (then it is reported, never signalled)."""
        if proc.unread("stat"):
            return f"not fully read ({_missing(proc)}): its state, parent and start time are unknown"
        if not self.in_root and proc.pidns is None:
            return "PID namespace unreadable"
        if self.scope is not None and self.scope.contains(proc) is None:
            return "cgroup unreadable: cannot tell whether it is in the scope"
        if self.same_cgroup and not (proc.cgroup and self.own_cgroup):
            return "cgroup unreadable: cannot tell whether it is in this container"
        return None


def _missing(proc: ProcessInfo) -> str:
    """The files that could not be used, and why: ``fd: access_denied, cgroup: missing``."""
    return ", ".join(f"{u.file}: {u.reason.value}" for u in proc.incomplete)


def _reasons(proc: ProcessInfo, orphan: Orphan | None, nvml_memory: int | None) -> list[str]:
    """Why ``proc`` is a target, if it is in scope: its /dev/nvidia* fds, NVML's listing, its orphaning."""
    reasons = []
    if proc.nvidia_fds:
        reasons.append("holds " + ", ".join(proc.nvidia_fds))
    if nvml_memory is not None:
        reasons.append(f"listed by NVML ({nvml_memory // MIB} MiB)")
    if orphan is not None and orphan.verdict != CANNOT_TELL:
        reasons.append("orphan: " + "; ".join(orphan.evidence))
    return reasons


def plan_targets(
    table: ProcessTable,
    gpus: GpuSnapshot,
    *,
    own_pid: int,
    include_orphans: bool = True,
    same_cgroup: bool = False,
    scope: Scope | None = None,
) -> PrestopPlan:
    """Decide targets, exclusions and unread processes from one snapshot. Pure: reads, signals nothing.

    ``same_cgroup`` keeps to processes in this process's own cgroup: with
    ``shareProcessNamespace: true`` the pod's containers share one PID namespace, and the hook
    should stop only its own container's processes. In the host's PID namespace (a ``hostPID``
    pod, a node shell) ``scope`` is required, else GpuzombieError (exit 2): there the namespace
    holds the node's own GPU users (nvidia-persistenced, DCGM), every hostPID pod and every
    session, and a cgroup may be shared by unrelated sessions."""
    me = table.get(own_pid)
    own_pidns = me.pidns if me else None
    require_scope(own_pidns, scope)
    in_root = is_root_pidns(own_pidns)
    rules = _Rules(
        own_pid=own_pid,
        me=me,
        in_root=in_root,
        protected=frozenset({own_pid} | {p.pid for p in table.parents(own_pid)}),
        scope=scope,
        same_cgroup=same_cgroup,
    )
    # In the host's namespace PID 1 is the node's init with legitimate children: no orphan sweep.
    orphans_on = include_orphans and not in_root
    found = find_orphans(table, find_pid1(table), exclude=rules.protected, now=table.taken_at) if orphans_on else ()
    orphans = {o.pid: o for o in found}
    refs = (
        attribute_processes(table, gpus, ReaderView(in_root_pidns=in_root, own_pid=own_pid)) if gpus.available else ()
    )
    nvml_memory = _nvml_matches(refs, table, own_pidns, in_root)

    targets: list[Target] = []
    excluded: list[Untargeted] = []
    unread: list[Untargeted] = []
    for proc in table:
        orphan = orphans.get(proc.pid)
        reasons = _reasons(proc, orphan, nvml_memory.get(proc.pid))
        why_not = rules.outside(proc)
        if why_not is not None:
            if reasons:
                excluded.append(Untargeted(proc.pid, proc.comm, why_not))
            continue
        unknown = rules.unknown(proc)
        if unknown is None and proc.could_hide_finding and not reasons:
            unknown = f"not fully read ({_missing(proc)}): a /dev/nvidia* fd or an orphan could hide there"
        if unknown is not None:
            unread.append(Untargeted(proc.pid, proc.comm, unknown))
            continue
        if not reasons:
            if orphan is not None:  # observe's "cannot tell": PID 1 may have started it
                excluded.append(
                    Untargeted(proc.pid, proc.comm, "child of PID 1 that PID 1 may have started (cannot tell)")
                )
            continue
        targets.append(Target.of(proc, reasons, nvml_memory.get(proc.pid)))
    unread += [Untargeted(pid, "?", "not read before the scan's deadline") for pid in table.unread]
    pid1 = table.get(1)
    return PrestopPlan(
        own_pid=own_pid,
        own_pidns=own_pidns,
        in_root_pidns=in_root,
        pid1_command=pid1.command if pid1 else None,
        orphans_included=orphans_on,
        scope=scope.describe() if scope else None,
        scope_matched=sum(scope.contains(p) is True for p in table) if scope else None,
        gpu_available=gpus.available,
        gpu_reason=gpus.reason,
        targets=tuple(targets),
        excluded=tuple(excluded),
        unread=tuple(unread),
    )
