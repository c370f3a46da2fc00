"""The node trace: every GPU process, /dev/nvidia* holder and zombie mapped to its container and pod,
and every MiB of each GPU accounted for.

The seed's ``gpu-pod-trace.sh`` + ``node-observe.sh``: NVML's processes and fd holders come from the
foundation's attribution, containers and pods from each process's cgroup lines, names from crictl
and the kubelet's PodResources API when they answer. Memory per GPU is split into the driver's
reservation (present with no process at all: 615 MiB on an idle H200, driver 580.159), what listed
processes hold, and the rest, which is called a ghost only above a threshold and with the evidence
for its likely cause.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuzombie.gpu.attribution import (
    DEFAULT_GHOST_THRESHOLD,
    FdHolder,
    GhostMemory,
    GpuProcessRef,
    ReaderView,
    Verdict,
    attribute,
)
from gpuzombie.gpu.nvml import GpuDevice, GpuSnapshot, NvmlBackend, mib, read_gpus
from gpuzombie.k8s.cgroup import ContainerRef, parse_cgroup_lines
from gpuzombie.k8s.cri import CriNames
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs
from gpuzombie.trace.scan import scan

SCHEMA = "gpuzombie.trace/1"
_GPU_NODE = re.compile(r"/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class TraceRow:
    """One line of the seed's table: a process (on one GPU, for NVML's entries) and its pod."""

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
    gpu_memory_mib: float | None
    """MiB NVML attributes to it on that GPU; None when not listed or not reported."""
    nsmi: bool
    """Listed by NVML (the seed's NSMI column: nvidia-smi sees it)."""
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


@dataclass(frozen=True)
class Allocation:
    """A container the kubelet gave this GPU to (PodResources)."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory in MiB, accounted for: used = baseline + processes + unexplained."""

    index: int
    uuid: str
    name: str
    total_mib: float
    used_mib: float
    baseline_mib: float
    baseline_source: str
    process_memory_mib: float
    unexplained_mib: float
    threshold_mib: float
    verdict: str
    """ok, ghost (flagged above the threshold) or cannot_tell."""
    flagged: bool
    likely_causes: tuple[str, ...]
    allocated_to: tuple[Allocation, ...]


@dataclass(frozen=True)
class GpuStatus:
    available: bool
    reason: str | None
    driver_version: str | None


@dataclass(frozen=True)
class Sources:
    procfs: str
    crictl: str | None
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
    healthy: bool


@dataclass(frozen=True)
class TraceReport:
    schema: str
    taken_at: float
    gpu: GpuStatus
    sources: Sources
    rows: tuple[TraceRow, ...]
    gpus: tuple[GpuMemory, ...]
    baseline_note: str
    warnings: tuple[str, ...]
    summary: TraceSummary


NamesLookup = Callable[[Iterable[str]], CriNames]


def _gpu_nodes(devices: Iterable[str]) -> list[int]:
    return sorted({int(m.group(1)) for d in devices if (m := _GPU_NODE.match(d))})


def _row(
    proc: ProcessInfo | None,
    ref: ContainerRef | None,
    names: CriNames,
    *,
    pid: int | None,
    gpu: tuple[int | None, str | None],
    memory: int | None,
    nsmi: bool,
    verdict: str,
    evidence: str,
) -> TraceRow:
    cnames = names.container(ref.container_id) if ref else None
    pnames = names.pod(ref.pod_uid) if ref else None
    return TraceRow(
        pid=pid,
        nspid=proc.innermost_pid if proc else None,
        state=proc.state if proc else "-",
        comm=proc.comm if proc else None,
        gpu_index=gpu[0],
        gpu_uuid=gpu[1],
        gpu_memory_mib=None if memory is None else mib(memory),
        nsmi=nsmi,
        verdict=verdict,
        qos=ref.qos if ref else None,
        pod=(cnames.pod if cnames else None) or (pnames.pod if pnames else None),
        namespace=(cnames.namespace if cnames else None) or (pnames.namespace if pnames else None),
        container=cnames.container if cnames else None,
        container_id=ref.container_id if ref else None,
        pod_uid=(ref.pod_uid if ref else None) or (cnames.pod_uid if cnames else None),
        runtime=ref.runtime if ref else None,
        cgroup_version=ref.cgroup_version if ref else None,
        cgroup_driver=ref.driver if ref else None,
        devices=proc.nvidia_fds if proc else (),
        evidence=evidence,
    )


def build_rows(
    table: ProcessTable,
    refs: Iterable[GpuProcessRef],
    holders: Iterable[FdHolder],
    containers: dict[int, ContainerRef | None],
    names: CriNames,
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
                containers.get(pid) if pid is not None else None,
                names,
                pid=pid if proc else r.host_pid,
                gpu=(r.gpu_index, r.gpu_uuid),
                memory=r.used_memory,
                nsmi=True,
                verdict=r.verdict.value,
                evidence=r.evidence,
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
                containers.get(h.pid),
                names,
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
                    containers.get(proc.pid),
                    names,
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
    allocated = tuple(
        sorted(
            {Allocation(a.namespace, a.pod, a.container) for a in resources.for_device(device.uuid)},
            key=lambda a: (a.namespace, a.pod, a.container),
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
        total_mib=mib(device.memory_total),
        **ghost.accounting_mib(threshold),
        likely_causes=tuple(causes),
        allocated_to=allocated,
    )


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


def trace_node(
    *,
    procfs: Procfs,
    nvml: NvmlBackend,
    view: ReaderView,
    names: NamesLookup,
    resources: PodResources,
    now: float,
    baseline: int | None = None,
    threshold: int = DEFAULT_GHOST_THRESHOLD,
) -> TraceReport:
    """Read the node once and map everything; raises OSError when the procfs cannot be listed and
    ValueError when its stat file has no boot time."""
    gpus = read_gpus(nvml)
    nvml_pids = {p.pid for d in gpus.devices for p in d.processes}
    table = scan(procfs, nvml_pids if view.in_root_pidns else (), now=now, skip=view.own_pid)
    att = attribute(table, gpus, view, baseline=baseline, threshold=threshold)
    containers = {p.pid: parse_cgroup_lines(p.cgroup) for p in table}
    cri = names(sorted({c.container_id for c in containers.values() if c and c.container_id}))
    rows = build_rows(table, att.processes, att.fd_holders, containers, cri)
    memory = tuple(account_memory(d, g, rows, resources, threshold) for d, g in zip(gpus.devices, att.ghosts))
    warnings = list(cri.warnings)
    if resources.warning:
        warnings.append(resources.warning)
    if not gpus.available:
        warnings.append(f"GPU: {gpus.reason}; showing /dev/nvidia* holders and zombies only")
    zombies = sum(r.state == "Z" for r in rows)
    gone = sum(r.verdict == Verdict.GONE.value for r in rows)
    ghost_gpus = sum(m.flagged for m in memory)
    summary = TraceSummary(
        rows=len(rows),
        gpu_processes=sum(r.nsmi for r in rows),
        fd_only=sum(r.verdict == "fd-only" for r in rows),
        zombies=zombies,
        gone=gone,
        ghost_gpus=ghost_gpus,
        unmapped=sum(r.pid is not None and r.container_id is None and r.pod_uid is None for r in rows),
        healthy=not (zombies or gone or ghost_gpus),
    )
    return TraceReport(
        schema=SCHEMA,
        taken_at=now,
        gpu=GpuStatus(gpus.available, gpus.reason, gpus.driver_version),
        sources=Sources(procfs=procfs.root, crictl=cri.source, pod_resources=resources.source),
        rows=tuple(rows),
        gpus=memory,
        baseline_note=baseline_note(gpus),
        warnings=tuple(warnings),
        summary=summary,
    )
