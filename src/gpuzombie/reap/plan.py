"""Which processes ``gpuzombie reap`` may end: those in the cgroups of stale pods, nothing else.

A pod is stale when trace (``trace.stale``) found a GPU holder of it that outlived it: the runtime
no longer lists the pod, or lists it only with stopped sandboxes. Every live process in such a
pod's cgroup is a leftover of it (the kubelet would have ended them all), so each is a target.
Never: a process of a pod the runtime runs, a host process (no pod in its cgroup), this process
or its ancestors, the node's PID 1, a zombie (nothing to signal). A process whose cgroup could not
be read could be in a stale pod: it is reported as unread and never signalled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuzombie.k8s.owner import in_cgroup
from gpuzombie.prestop.targets import Target, Untargeted
from gpuzombie.proc.procfs import ProcessTable
from gpuzombie.trace.model import TraceReport
from gpuzombie.trace.stale import Dirty


@dataclass(frozen=True)
class StalePod:
    pod_uid: str
    namespace: str | None
    pod: str | None
    reason: str
    holders: tuple[int, ...]
    """Pids of its GPU holders (the processes that made it stale)."""
    gpu_memory: int
    """Bytes NVML attributes to them."""


@dataclass(frozen=True)
class ReapPlan:
    stale_pods: tuple[StalePod, ...]
    targets: tuple[Target, ...]
    unread: tuple[Untargeted, ...]
    skipped_pods: tuple[str, ...] = ()
    """Stale pods left out by ``--pod-uid``."""


def stale_pods(report: TraceReport, only: Iterable[str] | None = None) -> tuple[list[StalePod], list[str]]:
    """The stale pods of a trace (``only`` narrows them to those UIDs) and the UIDs left out."""
    wanted = set(only) if only is not None else None
    found: dict[str, list] = {}
    for row in report.rows:
        if row.dirty != Dirty.STALE or row.pod_uid is None or row.pid is None:
            continue
        found.setdefault(row.pod_uid, []).append(row)
    pods, skipped = [], []
    for uid, rows in sorted(found.items()):
        if wanted is not None and uid not in wanted:
            skipped.append(uid)
            continue
        pods.append(
            StalePod(
                pod_uid=uid,
                namespace=next((r.namespace for r in rows if r.namespace), None),
                pod=next((r.pod for r in rows if r.pod), None),
                reason=rows[0].dirty_reason or "stale",
                holders=tuple(sorted({r.pid for r in rows})),
                gpu_memory=sum(r.gpu_memory or 0 for r in rows),
            )
        )
    return pods, skipped


def stale_targets(
    table: ProcessTable, pods: Iterable[StalePod], *, own_pid: int, memory: dict[int, int] | None = None
) -> tuple[list[Target], list[Untargeted]]:
    """Every live process of ``table`` in the cgroup of one of ``pods``; the unreadable ones apart.
    ``memory``: bytes NVML attributes to a pid (shown in the report)."""
    by_uid = {p.pod_uid: p for p in pods}
    holders = {pid: p for p in by_uid.values() for pid in p.holders}
    protected = {1, own_pid} | {p.pid for p in table.parents(own_pid)}
    targets: list[Target] = []
    unread: list[Untargeted] = []
    if not by_uid:
        return targets, unread
    for proc in table:
        if proc.pid in protected or proc.is_zombie:
            continue
        if not proc.cgroup or proc.unread("stat"):
            if proc.unread("cgroup") or proc.unread("stat"):
                unread.append(Untargeted(proc.pid, proc.comm, "cgroup or stat unreadable: it could be in a stale pod"))
            continue
        ref = in_cgroup(proc).ref  # its own cgroup alone: never a process its PID namespace or parent places
        pod = by_uid.get(ref.pod_uid) if ref is not None and ref.pod_uid else None
        if pod is None:
            continue
        holder = holders.get(proc.pid)
        reasons = [holder.reason] if holder is not None else [f"in the cgroup of stale pod {pod.pod_uid}"]
        if proc.nvidia_fds:
            reasons.append("holds " + ", ".join(proc.nvidia_fds))
        targets.append(Target.of(proc, reasons, (memory or {}).get(proc.pid)))
    return targets, unread
