"""The node trace: every GPU process, /dev/nvidia* holder and zombie mapped to its container and pod,
and every MiB of each GPU accounted for.

The original experiment's ``gpu-pod-trace.sh`` + ``node-observe.sh``: NVML's processes and fd holders come from the
foundation's attribution, containers and pods from each process's cgroup lines, names from the CRI runtime
and the kubelet's PodResources API when they answer. Memory per GPU is split into the driver's
reservation (present with no process at all: 615 MiB on an idle H200, driver 580.159), what listed
processes hold, and the rest, which is called a ghost only above a threshold and with the evidence
for its likely cause.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

from gpuzombie.gpu.attribution import (
    DEFAULT_GHOST_THRESHOLD,
    FdHolder,
    GhostMemory,
    GpuProcessRef,
    ProcessVerdict,
    ReaderView,
    attribute,
)
from gpuzombie.gpu.deviceids import kubelet_ids, without_replica
from gpuzombie.gpu.dstate import DStateHolder, d_state_holders
from gpuzombie.gpu.nvml import GpuDevice, GpuSnapshot, GpuStatus, MigInstance, NvmlBackend, read_gpus
from gpuzombie.jsonout import IN_MIB, SchemaReport
from gpuzombie.k8s.liveness import RuntimePods
from gpuzombie.k8s.names import CriNames
from gpuzombie.k8s.owner import NamesLookup, Owner, Owners, resolve
from gpuzombie.k8s.podresources import Allocation, PodResources
from gpuzombie.proc.pidfd import read_start_and_state
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs, describe_unreadable
from gpuzombie.trace.stale import Dirty, DirtyChecks, Holder, judge

SCHEMA = "gpuzombie.trace/1"
_GPU_NODE = re.compile(r"/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class TraceRow:
    """One line of the original experiment's table: a process (on one GPU, for NVML's entries) and its pod."""

    pid: int | None
    """The pid in the procfs read (the host pid on a node); None for an NVML pid with no process."""
    nspid: int | None
    """The pid inside the process's own PID namespace (what ``ps`` in its container shows)."""
    state: str
    """R, S, D, Z, ... from /proc; "-" when NVML lists a pid that no longer exists."""
    comm: str | None
    gpu_index: int | None
    """The GPU NVML lists it on; for fd-only holders None (see ``devices``)."""
    gpu_uuid: str | None
    gpu_memory: int | None = field(metadata=IN_MIB)
    """Bytes NVML attributes to it on that GPU; None when not listed or not reported."""
    nsmi: bool
    """Listed by NVML (the original experiment's NSMI column: nvidia-smi sees it)."""
    verdict: str
    """live, zombie, gone, unresolved (NVML entries); fd-only (holds /dev/nvidia*, not listed); zombie (any other)."""
    qos: str | None
    pod: str | None
    namespace: str | None
    container: str | None
    container_id: str | None
    pod_uid: str | None
    runtime: str | None
    cgroup_version: str | None
    cgroup_driver: str | None
    devices: tuple[str, ...]
    evidence: str
    unread: tuple[str, ...] = ()
    """Files of the process that could not be used (``cgroup``: the pod is unknown, not absent)."""
    mig: MigInstance | None = None
    """The MIG GPU instance NVML lists it on (None without MIG)."""
    dirty: Dirty | None = None
    """stale, foreign or unknown (``trace.stale``); None for a holder where it should be, or no holder."""
    dirty_reason: str | None = None


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory in bytes, accounted for: used = baseline + processes + unexplained."""

    index: int
    uuid: str
    name: str
    total: int = field(metadata=IN_MIB)
    used: int = field(metadata=IN_MIB)
    baseline: int = field(metadata=IN_MIB)
    baseline_source: str
    process_memory: int = field(metadata=IN_MIB)
    unexplained: int = field(metadata=IN_MIB)
    threshold: int = field(metadata=IN_MIB)
    verdict: str
    """ok, ghost (flagged above the threshold) or cannot_tell."""
    flagged: bool
    likely_causes: tuple[str, ...]
    allocated_to: tuple[Allocation, ...]
    mig: MigInstance | None = None
    """With MIG mode on: the GPU instance this is (its memory, its processes); the rest is the GPU's."""


@dataclass(frozen=True)
class Sources:
    procfs: str
    cri_socket: str | None
    pod_resources: str | None


@dataclass(frozen=True)
class TraceSummary:
    rows: int
    gpu_processes: int
    fd_only: int
    zombies: int
    gone: int
    ghost_gpus: int
    unmapped: int
    """Rows whose process sits in no container and no pod (host processes)."""
    incomplete: int
    """Processes read that could not be fully read (any file), plus pids the deadline left unread."""
    access_denied: int
    """Of those, the ones a file of which denied access."""
    unverified: int
    """Of those, the ones that could hide a finding (a holder, a zombie, a row's pod): while any
    is left the node is not called healthy."""
    healthy: bool
    d_state: int = 0
    """GPU holders in state D (named, not a finding: a short D is normal; the exporter times them)."""
    stale: int = 0
    """GPU holders in the cgroup of a pod the runtime no longer runs (``trace.stale``)."""
    foreign: int = 0
    """GPU holders in a pod the kubelet did not give that GPU to."""
    dirty_unknown: int = 0
    """Pods' GPU holders that could not be judged stale or not (the runtime was not read)."""


@dataclass(frozen=True)
class TraceReport(SchemaReport):
    gpu: GpuStatus
    sources: Sources
    rows: tuple[TraceRow, ...]
    gpus: tuple[GpuMemory, ...]
    baseline_note: str
    warnings: tuple[str, ...]
    summary: TraceSummary
    d_state: tuple[DStateHolder, ...] = ()
    """Processes in state D holding GPU memory or /dev/nvidia* (their rows say the pod)."""
    checks: DirtyChecks = field(default_factory=DirtyChecks)


PodsLookup = Callable[[], RuntimePods]


def _gpu_nodes(devices: Iterable[str]) -> list[int]:
    return sorted({int(m.group(1)) for d in devices if (m := _GPU_NODE.match(d))})


def _row(
    proc: ProcessInfo | None,
    owner: Owner,
    *,
    pid: int | None,
    gpu: tuple[int | None, str | None],
    memory: int | None,
    nsmi: bool,
    verdict: str,
    evidence: str,
    mig: MigInstance | None = None,
) -> TraceRow:
    ref = owner.ref
    return TraceRow(
        pid=pid,
        nspid=proc.innermost_pid if proc else None,
        state=proc.state if proc else "-",
        comm=proc.comm if proc else None,
        gpu_index=gpu[0],
        gpu_uuid=gpu[1],
        gpu_memory=memory,
        nsmi=nsmi,
        verdict=verdict,
        qos=ref.qos if ref else None,
        pod=owner.pod,
        namespace=owner.namespace,
        container=owner.container,
        container_id=ref.container_id if ref else None,
        pod_uid=owner.pod_uid,
        runtime=ref.runtime if ref else None,
        cgroup_version=ref.cgroup_version if ref else None,
        cgroup_driver=ref.driver if ref else None,
        devices=proc.nvidia_fds if proc else (),
        evidence=evidence,
        unread=tuple(dict.fromkeys(u.file for u in proc.incomplete)) if proc else (),
        mig=mig,
    )


def build_rows(
    table: ProcessTable,
    refs: Iterable[GpuProcessRef],
    holders: Iterable[FdHolder],
    owners: Owners,
) -> list[TraceRow]:
    """NVML entries first (one row per GPU), then unlisted fd holders, then zombies not yet shown."""
    rows: list[TraceRow] = []
    shown: set[int] = set()
    for r in refs:
        pid = r.reader_pid
        proc = table.get(pid) if pid is not None else None
        rows.append(
            _row(
                proc,
                owners.of(pid),
                pid=pid if proc else r.host_pid,
                gpu=(r.gpu_index, r.gpu_uuid),
                memory=r.used_memory,
                nsmi=True,
                verdict=r.verdict.value,
                evidence=r.evidence,
                mig=r.mig,
            )
        )
        if pid is not None:
            shown.add(pid)
    for h in holders:
        if h.listed_by_nvml or h.pid in shown:
            continue
        proc = table.get(h.pid)
        nodes = _gpu_nodes(h.devices)
        rows.append(
            _row(
                proc,
                owners.of(h.pid),
                pid=h.pid,
                gpu=(nodes[0] if len(nodes) == 1 else None, None),
                memory=None,
                nsmi=False,
                verdict="zombie" if h.state == "Z" else "fd-only",
                evidence="holds " + ", ".join(h.devices) + "; NVML lists it on no GPU",
            )
        )
        shown.add(h.pid)
    for proc in table:
        if proc.is_zombie and proc.pid not in shown:
            rows.append(
                _row(
                    proc,
                    owners.of(proc.pid),
                    pid=proc.pid,
                    gpu=(None, None),
                    memory=None,
                    nsmi=False,
                    verdict="zombie",
                    evidence=f"state Z, parent {proc.ppid} has not reaped it",
                )
            )
    return rows


def _peer_evidence(device: GpuDevice, rows: list[TraceRow]) -> list[str]:
    """A process NVML lists on another GPU that also holds this GPU's device node: its peer context."""
    node = f"/dev/nvidia{device.index}"
    found = []
    for row in rows:
        if row.nsmi and row.gpu_index != device.index and node in row.devices and row.pid is not None:
            where = f" (pod {row.namespace}/{row.pod})" if row.pod else ""
            found.append(
                f"pid {row.pid}{where}, listed on GPU {row.gpu_index}, also holds {node}: "
                "likely its peer context (NCCL/P2P), freed when that process exits"
            )
    return sorted(set(found))


def account_memory(
    device: GpuDevice, ghost: GhostMemory, rows: list[TraceRow], resources: PodResources, threshold: int
) -> GpuMemory:
    causes = list(ghost.likely_causes)
    if ghost.unexplained > 0 and ghost.verdict != "ok":
        causes = _peer_evidence(device, rows) + causes
    ids = kubelet_ids(device.uuid, device.index, device.mig, device.minor_number)
    allocated = tuple(
        sorted(
            {a.allocation for a in resources.gpu_assignments if without_replica(a.device_id) in ids},
            key=lambda a: (a.namespace, a.pod, a.container, a.claim.device if a.claim else ""),
        )
    )
    if allocated and ghost.verdict != "ok":
        causes.append(
            "allocated by the kubelet to " + ", ".join(f"{a.namespace}/{a.pod}/{a.container}" for a in allocated)
        )
    return GpuMemory(
        index=device.index,
        uuid=device.uuid,
        name=device.name,
        total=device.memory_total,
        threshold=threshold,
        likely_causes=tuple(causes),
        allocated_to=allocated,
        mig=device.mig,
        **{name: getattr(ghost, name) for name in _FROM_GHOST},
    )


_FROM_GHOST = ("used", "baseline", "baseline_source", "process_memory", "unexplained", "verdict", "flagged")
"""The accounting a GpuMemory carries over from the GPU's GhostMemory as it is."""


def baseline_note(gpus: GpuSnapshot) -> str:
    if not gpus.available:
        return "no GPU readable: memory not accounted"
    if all(d.memory_reserved is not None for d in gpus.devices):
        return (
            "baseline = the driver's own reservation (NVML memory v2 'reserved'): present with no "
            "process at all, 615 MiB per GPU on an H200 with driver 580.159; not a ghost"
        )
    return (
        "this driver reports no reservation: give --baseline-mib (used memory of the idle GPU), "
        "else the driver's own footprint counts as unexplained"
    )


def mark_dirty(
    rows: list[TraceRow],
    table: ProcessTable,
    pods: RuntimePods | None,
    resources: PodResources,
    minors: Mapping[str, int] | None = None,
) -> tuple[list[TraceRow], DirtyChecks]:
    """Stale and foreign GPU holders among ``rows`` (``trace.stale``); ``pods`` read after ``table``;
    ``minors``: each GPU's minor number by UUID (names the GPU a DRA device is)."""
    minors = minors or {}

    def holder(row: TraceRow) -> Holder:
        proc = table.get(row.pid) if row.pid is not None else None
        return Holder(
            pid=row.pid if proc else None,
            start_ticks=proc.start_ticks if proc else None,
            pod_uid=row.pod_uid,
            namespace=row.namespace,
            pod=row.pod,
            runtime=row.runtime,
            gpu_uuid=row.gpu_uuid,
            gpu_instance=row.mig.gpu_instance_id if row.mig else None,
            device_ids=kubelet_ids(row.gpu_uuid, row.gpu_index, row.mig, minors.get(row.gpu_uuid))
            if row.gpu_uuid is not None and row.gpu_index is not None
            else frozenset(),
            live=row.nsmi and row.verdict == ProcessVerdict.LIVE.value,
            holds_gpu=proc is not None and row.state != "Z" and (row.nsmi or bool(row.devices)),
        )

    def still_there(pid: int, start_ticks: int) -> bool:
        now = read_start_and_state(table.procfs_root, pid)
        return now is not None and now[0] == start_ticks and now[1] not in ("Z", "X")

    verdicts, checks = judge([holder(r) for r in rows], pods=pods, resources=resources, still_there=still_there)
    marked = [
        dataclasses.replace(row, dirty=v[0], dirty_reason=v[1]) if v is not None else row
        for row, v in zip(rows, verdicts)
    ]
    return marked, checks


def read_trace_table(procfs: Procfs, gpus: GpuSnapshot, view: ReaderView, *, now: float) -> ProcessTable:
    """The processes a trace is about, read cheaply: one stat or fd listing per pid finds the
    zombies, /dev/nvidia* holders and pids NVML lists (and those that cannot be ruled out); only
    they are read in full. Raises OSError or ValueError when the tree itself is unreadable."""
    deadline = procfs.deadline()
    nvml_pids = {p.pid for d in gpus.devices for p in d.processes} if view.in_root_pidns else set()
    pids, unread = procfs.relevant_pids(nvml_pids, skip=view.own_pid, deadline=deadline)
    table = procfs.snapshot(pids, now=now, deadline=deadline)
    return dataclasses.replace(table, unread=unread + table.unread) if unread else table


def _warnings(
    cri: CriNames, resources: PodResources, gpus: GpuSnapshot, table: ProcessTable, shown_pids: set[int]
) -> list[str]:
    warnings = list(cri.warnings)
    if resources.warning:
        warnings.append(resources.warning)
    warnings.extend(resources.dra_warnings)
    if not gpus.available:
        warnings.append(f"GPU: {gpus.reason}; showing /dev/nvidia* holders and zombies only")
    unreadable = describe_unreadable(table, shown_pids)
    if unreadable:
        warnings.append(unreadable)
    return warnings


def _summary(
    rows: list[TraceRow],
    memory: tuple[GpuMemory, ...],
    table: ProcessTable,
    shown_pids: set[int],
    d_state: tuple[DStateHolder, ...],
) -> TraceSummary:
    incomplete = table.incomplete
    zombies = sum(r.state == "Z" for r in rows)
    gone = sum(r.verdict == ProcessVerdict.GONE.value for r in rows)
    ghost_gpus = sum(m.flagged for m in memory)
    not_verified = len(table.unverified(shown_pids)) + len(table.unread)
    stale = sum(r.dirty == Dirty.STALE for r in rows)
    foreign = sum(r.dirty == Dirty.FOREIGN for r in rows)
    dirty_unknown = sum(r.dirty == Dirty.UNKNOWN for r in rows)
    return TraceSummary(
        rows=len(rows),
        gpu_processes=sum(r.nsmi for r in rows),
        fd_only=sum(r.verdict == "fd-only" for r in rows),
        zombies=zombies,
        gone=gone,
        ghost_gpus=ghost_gpus,
        unmapped=sum(r.pid is not None and r.container_id is None and r.pod_uid is None for r in rows),
        incomplete=len(incomplete) + len(table.unread),
        access_denied=sum(p.access_denied for p in incomplete),
        unverified=not_verified,
        healthy=not (zombies or gone or ghost_gpus or not_verified or stale or foreign or dirty_unknown),
        d_state=len(d_state),
        stale=stale,
        foreign=foreign,
        dirty_unknown=dirty_unknown,
    )


def build_trace(
    table: ProcessTable,
    gpus: GpuSnapshot,
    *,
    view: ReaderView,
    names: NamesLookup,
    resources: PodResources,
    now: float,
    baseline: int | None = None,
    threshold: int = DEFAULT_GHOST_THRESHOLD,
    pods: PodsLookup | None = None,
) -> tuple[TraceReport, Owners]:
    """Map every process of ``table`` that matters (a full node table or ``read_trace_table``'s), and
    name the owner of every process of it (``k8s.owner``: the rows are named by them).

    ``pods``, when given, is asked once, after ``table`` was read, which pods the runtime runs:
    GPU holders of the others are stale (``trace.stale``)."""
    att = attribute(table, gpus, view, baseline=baseline, threshold=threshold)
    shown_pids = {r.reader_pid for r in att.processes if r.reader_pid is not None}
    shown_pids |= {h.pid for h in att.fd_holders} | {p.pid for p in table if p.is_zombie}
    owners = resolve(table, names, ask=shown_pids)
    rows = build_rows(table, att.processes, att.fd_holders, owners)
    minors = {d.uuid: d.minor_number for d in gpus.devices if d.minor_number is not None}
    rows, checks = mark_dirty(rows, table, pods() if pods is not None else None, resources, minors)
    memory = tuple(account_memory(d, g, rows, resources, threshold) for d, g in zip(gpus.devices, att.ghosts))
    warnings = _warnings(owners.names, resources, gpus, table, shown_pids)
    dirty_unknown = sum(r.dirty == Dirty.UNKNOWN for r in rows)
    if dirty_unknown:
        why = checks.stale_problem or next(r.dirty_reason for r in rows if r.dirty == Dirty.UNKNOWN)
        if any(why and why in w for w in warnings):  # the names' lookup said it already
            why = "the runtime could not be read (above)"
        warnings.append(f"{dirty_unknown} pod GPU holder(s) not judged stale or not: {why}")
    d_state = d_state_holders(table, att)
    report = TraceReport(
        schema=SCHEMA,
        taken_at=now,
        gpu=gpus.status,
        sources=Sources(procfs=table.procfs_root, cri_socket=owners.names.source, pod_resources=resources.source),
        rows=tuple(rows),
        gpus=memory,
        baseline_note=baseline_note(gpus),
        warnings=tuple(warnings),
        summary=_summary(rows, memory, table, shown_pids, d_state),
        d_state=d_state,
        checks=checks,
    )
    return report, owners


class TraceSettings(TypedDict, total=False):
    """How a trace judges, as ``build_trace`` takes it (its defaults where left out): the ghost
    baseline and threshold, and the runtime's pods for stale holders. Named once, so that the node
    scans (``trace_node``, ``trace.scan.scan_node``) pass them on as they are."""

    baseline: int | None
    threshold: int
    pods: PodsLookup | None


def trace_node(
    *,
    procfs: Procfs,
    nvml: NvmlBackend,
    view: ReaderView,
    names: NamesLookup,
    resources: PodResources,
    now: float,
    **settings: Unpack[TraceSettings],
) -> TraceReport:
    """Read the node once and map everything; raises OSError when the procfs cannot be listed and
    ValueError when its stat file has no boot time."""
    gpus = read_gpus(nvml)
    table = read_trace_table(procfs, gpus, view, now=now)
    report, _ = build_trace(table, gpus, view=view, names=names, resources=resources, now=now, **settings)
    return report
