"""One node scan, the exporter's and top's: one walk of the node's own procfs, read into one table,
from which come both the trace report (GPU processes, fd holders, zombies, memory per GPU in bytes,
mapped to pods) and the per-namespace survey (orphans, zombies by parent, SIGTERM reach), with one
CRI lookup naming the containers of both. Outside ``exporter/``: it needs no prometheus-client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Unpack

from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.dstate import DStateTracker
from gpuzombie.gpu.nvml import NO_GPU, GpuSnapshot, NvmlBackend, read_gpus
from gpuzombie.k8s.names import CriNames
from gpuzombie.k8s.owner import NamesLookup, Owners, PodLabels
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.observe.namespaces import NamespaceScan, NamespaceSurvey, survey
from gpuzombie.proc.procfs import ProcessCache, ProcessInfo, ProcessTable, Procfs
from gpuzombie.trace.model import TraceReport, TraceRow, TraceSettings, build_trace


@dataclass(frozen=True)
class NodeScan:
    trace: TraceReport
    namespaces: NamespaceSurvey
    owners: Owners
    """Every process of ``table``'s pod and container (``k8s.owner``), named by the runtime once."""
    duration_s: float
    table: ProcessTable
    """The node's processes as read, once, for both."""
    node_name: str = ""
    """The node's name: the ``Hostname`` label of GPU series, as dcgm-exporter's."""
    d_state_seconds: Mapping[tuple[int, int], float] = field(default_factory=dict)
    """Seconds each D-state GPU holder of ``trace.d_state`` has been seen in D, by (pid, start ticks),
    on the tracker's monotonic clock."""
    gpus: GpuSnapshot = NO_GPU
    """NVML's reading the trace was built from (``trace.gpus`` in the same order): the handover verdict
    judges it as preflight does."""

    def row_labels(self, row: TraceRow) -> PodLabels:
        """A trace row's labels: its process's owner's (none for an NVML pid with no process)."""
        return self.owners.of(row.pid if row.nspid is not None else None).labels

    def labels(self, ns: NamespaceScan) -> PodLabels:
        """A PID namespace's labels: its PID 1's owner's."""
        return self.owners.of(ns.pid1_host_pid).labels


def scan_node(
    *,
    procfs: Procfs,
    nvml: NvmlBackend,
    view: ReaderView,
    names: NamesLookup,
    resources: Callable[[], PodResources],
    now: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    node_name: str = "",
    dstate: DStateTracker | None = None,
    cache: ProcessCache | None = None,
    **settings: Unpack[TraceSettings],
) -> NodeScan:
    """Read the node once, survey its namespaces and trace it, asking the runtime once for both's
    containers; ``dstate`` (kept across scans) times the D-state GPU holders, and ``pods`` (asked
    after the procfs was read) tells stale GPU holders; ``cache`` (a long-lived caller's, kept across
    scans) reads again cheaply what it can vouch for, the fds of the processes NVML lists every time. Raises OSError or ValueError when the
    procfs itself cannot be read."""
    started = clock()
    now = time.time() if now is None else now
    gpus = read_gpus(nvml)
    nvml_pids = {p.pid for d in gpus.devices for p in d.processes}

    def named(proc: ProcessInfo, node_pidns: int | None) -> bool:
        """Names (cmdline, cgroup) matter for a container's process or one a trace row shows."""
        return proc.pidns != node_pidns or bool(proc.nvidia_fds) or proc.is_zombie or proc.pid in nvml_pids

    table = procfs.snapshot(now=now, detail=named, cache=cache, list_fds=nvml_pids)
    namespaces = survey(procfs, table, now=now)
    extra = {ns.container.container_id for ns in namespaces.namespaces if ns.container and ns.container.container_id}

    def lookup(ids: Iterable[str]) -> CriNames:
        return names(sorted(set(ids) | extra))

    trace, owners = build_trace(table, gpus, view=view, names=lookup, resources=resources(), now=now, **settings)
    in_d = (dstate or DStateTracker()).update(trace.d_state)
    return NodeScan(
        trace=trace,
        namespaces=namespaces,
        owners=owners,
        duration_s=clock() - started,
        table=table,
        node_name=node_name,
        d_state_seconds=in_d,
        gpus=gpus,
    )
