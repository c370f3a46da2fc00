"""``observe()``: one snapshot of a PID namespace (or a node) and its GPUs, judged; and its JSON form.

The JSON form (``ObserveReport.to_dict``) is a stable contract, schema ``gpuzombie.observe/1``,
documented in docs/observe.md; the lab and the pod scripts parse it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.attribution import (
    DEFAULT_GHOST_THRESHOLD,
    Attribution,
    GpuProcessRef,
    ProcessVerdict,
    ReaderView,
    attribute,
    current_view,
)
from gpuzombie.gpu.dstate import DStateHolder, d_state_holders
from gpuzombie.gpu.nvml import GpuDevice, GpuSnapshot, NvmlBackend, default_backend, read_gpus
from gpuzombie.jsonout import to_jsonable
from gpuzombie.observe.orphans import (
    ORPHAN,
    Orphan,
    Zombie,
    find_orphans,
    find_zombies,
    reader_chain,
)
from gpuzombie.observe.pid1 import Pid1, find_pid1
from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.pidns import is_root_pidns, procfs_is_own
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs, describe_unreadable, not_a_procfs
from gpuzombie.units import mib

SCHEMA = "gpuzombie.observe/1"


@dataclass(frozen=True)
class ViewInfo:
    """Where the report was taken from, and what it could not see."""

    procfs: str
    in_root_pidns: bool
    own_pid: int | None
    excluded_pids: tuple[int, ...]
    """The observer and its exec chain: listed as processes, never as findings."""
    is_root: bool
    processes_seen: int
    access_denied: int
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Summary:
    zombies: int
    orphans: int
    orphaned_contexts: int
    ghost_gpus: int
    gpu_processes: int
    incomplete: int = 0
    """Processes that could not be fully read (any file), plus pids the deadline left unread."""
    access_denied: int = 0
    unverified: int = 0
    """Of the incomplete, those that could hide a finding: while any is left, never HEALTHY."""
    d_state_holders: int = 0
    """GPU holders in state D: named, not a finding (a short D is normal; the exporter times them)."""

    @property
    def findings(self) -> bool:
        return bool(self.zombies or self.orphans or self.orphaned_contexts or self.ghost_gpus)

    @property
    def healthy(self) -> bool:
        return not (self.findings or self.unverified)


@dataclass(frozen=True)
class ObserveReport:
    taken_at: float
    view: ViewInfo
    pid1: Pid1
    table: ProcessTable
    zombies: tuple[Zombie, ...]
    orphans: tuple[Orphan, ...]
    gpu: GpuSnapshot
    attribution: Attribution
    ghost_threshold: int

    @property
    def orphaned_contexts(self) -> tuple[GpuProcessRef, ...]:
        """GPU memory attributed to a pid that is not alive (gone, or a zombie)."""
        return tuple(r for r in self.attribution.processes if r.verdict in (ProcessVerdict.GONE, ProcessVerdict.ZOMBIE))

    @property
    def d_state_holders(self) -> tuple[DStateHolder, ...]:
        """Processes in state D holding GPU memory or /dev/nvidia*."""
        return d_state_holders(self.table, self.attribution)

    @property
    def summary(self) -> Summary:
        return Summary(
            zombies=len(self.zombies),
            orphans=sum(1 for o in self.orphans if o.verdict == ORPHAN),
            orphaned_contexts=len(self.orphaned_contexts),
            ghost_gpus=sum(1 for g in self.attribution.ghosts if g.flagged),
            gpu_processes=len(self.attribution.processes),
            incomplete=len(self.table.incomplete) + len(self.table.unread),
            access_denied=sum(p.access_denied for p in self.table.incomplete),
            unverified=len(self.table.unverified((1,))) + len(self.table.unread),
            d_state_holders=len(self.d_state_holders),
        )

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if self.summary.healthy else ExitStatus.FINDINGS

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (schema ``gpuzombie.observe/1``); memory in MiB."""
        summary = self.summary
        return {
            "schema": SCHEMA,
            "taken_at": self.taken_at,
            "view": to_jsonable(self.view),
            "pid1": to_jsonable(self.pid1),
            "processes": [_process_dict(p, self.taken_at) for p in self.table],
            "zombies": to_jsonable(self.zombies),
            "orphans": to_jsonable(self.orphans),
            "gpu": {
                "available": self.gpu.available,
                "reason": self.gpu.reason,
                "driver_version": self.gpu.driver_version,
                "devices": [_device_dict(d) for d in self.gpu.devices],
            },
            "gpu_processes": [_gpu_process_dict(r) for r in self.attribution.processes],
            "fd_holders": to_jsonable(self.attribution.fd_holders),
            "ghosts": [{**to_jsonable(g), "threshold_mib": mib(self.ghost_threshold)} for g in self.attribution.ghosts],
            "orphaned_contexts": [_gpu_process_dict(r) for r in self.orphaned_contexts],
            "d_state_holders": to_jsonable(self.d_state_holders),
            "summary": {**to_jsonable(summary), "healthy": summary.healthy},
        }


def _mib(n: int | None) -> float | None:
    return None if n is None else mib(n)


def _fields(obj: object, *names: str) -> dict[str, Any]:
    """Attributes kept as they are, under their own names, in the report's order."""
    return {name: getattr(obj, name) for name in names}


def _process_dict(p: ProcessInfo, now: float) -> dict[str, Any]:
    return {
        **_fields(p, "pid", "ppid", "state", "uid", "pgid", "sid"),
        "nspid": list(p.nspid),
        **_fields(p, "comm", "command"),
        "age_s": round(max(0.0, now - p.start_time), 1),
        "nvidia_fds": list(p.nvidia_fds),
        "incomplete": to_jsonable(p.incomplete),
    }


_MEMORY_READINGS = ("total", "used", "free", "reserved")
"""NVML's memory readings of a device (``GpuDevice.memory_<reading>``), each reported in MiB."""


def _device_dict(d: GpuDevice) -> dict[str, Any]:
    return {
        **_fields(d, "index", "uuid", "name"),
        **{f"memory_{part}_mib": _mib(getattr(d, f"memory_{part}")) for part in _MEMORY_READINGS},
        "processes": len(d.processes),
        "mig_mode": d.mig_mode,
        "mig": to_jsonable(d.mig),
    }


def _gpu_process_dict(r: GpuProcessRef) -> dict[str, Any]:
    return {
        **_fields(r, "gpu_index", "gpu_uuid", "nvml_pid", "local_pid", "host_pid", "comm", "kind"),
        "used_memory_mib": _mib(r.used_memory),
        "verdict": r.verdict.value,
        "evidence": r.evidence,
        "mig": to_jsonable(r.mig),
    }


def _warnings(table: ProcessTable, is_root: bool) -> tuple[str, ...]:
    found = []
    if not is_root:
        denied = sum(1 for p in table if p.access_denied)
        found.append(
            f"not root: {denied} processes of other users could not be fully read (fds, "
            "cmdline); /dev/nvidia* holders among them are missing from this report"
        )
    unreadable = describe_unreadable(table, (1,))
    if unreadable:
        found.append(unreadable)
    return tuple(found)


def default_view(procfs: Procfs, table: ProcessTable) -> ReaderView:
    """The caller's own view of the tree it read.

    NVML pids equal the tree's pids only when both the caller and the tree are the root PID
    namespace's (a fake tree or a container's /proc read from the host is not); the caller's own
    pid applies only when it reads its own /proc.
    """
    view = current_view()
    init = table.get(1)
    tree_is_root = init is None or init.pidns is None or is_root_pidns(init.pidns)
    own = procfs_is_own(procfs.root) is True
    return ReaderView(in_root_pidns=view.in_root_pidns and tree_is_root, own_pid=view.own_pid if own else None)


def observe(
    procfs: Procfs | None = None,
    nvml: NvmlBackend | None = None,
    view: ReaderView | None = None,
    *,
    baseline: int | None = None,
    ghost_threshold: int = DEFAULT_GHOST_THRESHOLD,
    now: float | None = None,
    is_root: bool | None = None,
) -> ObserveReport:
    """Snapshot the processes and GPUs and judge them: the original experiment's eight checks in one report.

    Raises GpuzombieError (exit 2) when the procfs root itself cannot be read, or when /proc is
    not the caller's own namespace's; everything else (vanished processes, denied or hostile
    files, no NVML) is part of the report.
    """
    procfs = procfs or Procfs()
    now = time.time() if now is None else now
    if os.path.realpath(procfs.root) == PROCFS and procfs_is_own(procfs.root) is False:
        raise GpuzombieError(
            "/proc is not this PID namespace's procfs (entered with nsenter --pid but not --mount?): "
            "it shows another namespace's processes; enter the mount namespace too (nsenter --mount)",
            ExitStatus.ERROR,
        )
    try:
        table = procfs.snapshot(now=now, with_cgroup=False)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        why = not_a_procfs(procfs.root) or f"cannot read procfs at {procfs.root}: {reason}"
        raise GpuzombieError(why, ExitStatus.ERROR) from exc
    view = view or default_view(procfs, table)
    gpus = read_gpus(nvml or default_backend())
    excluded = reader_chain(table, view.own_pid)
    pid1 = find_pid1(table)
    attribution = attribute(table, gpus, view, baseline=baseline, threshold=ghost_threshold)
    is_root = os.geteuid() == 0 if is_root is None else is_root
    return ObserveReport(
        taken_at=now,
        view=ViewInfo(
            procfs=procfs.root,
            in_root_pidns=view.in_root_pidns,
            own_pid=view.own_pid,
            excluded_pids=excluded,
            is_root=is_root,
            processes_seen=len(table),
            access_denied=sum(1 for p in table if p.access_denied),
            warnings=_warnings(table, is_root),
        ),
        pid1=pid1,
        table=table,
        zombies=find_zombies(table, pid1, now=now),
        orphans=find_orphans(table, pid1, exclude=frozenset(excluded), now=now),
        gpu=gpus,
        attribution=attribution,
        ghost_threshold=ghost_threshold,
    )
