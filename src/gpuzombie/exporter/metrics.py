"""A NodeScan as Prometheus metric families (names, types and labels documented in the README)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuzombie.exporter.scan import NodeScan, PodLabels
from gpuzombie.gpu.nvml import MIB
from gpuzombie.trace.report import GpuMemory

POD = ("namespace", "pod", "container")
GPU = ("gpu", "uuid")
VERDICTS = ("ok", "ghost", "cannot_tell")
Values = defaultdict[tuple[str, ...], float]


def _pod(labels: PodLabels) -> tuple[str, str, str]:
    return (labels.namespace, labels.pod, labels.container)


def _gauge(name: str, doc: str, labels: tuple[str, ...], values: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _bytes(mib: float | None) -> float:
    return 0.0 if mib is None else mib * MIB


def process_metrics(scan: NodeScan) -> Iterator[Metric]:
    """Zombies, GPU processes and fd-only holders from the trace rows, labelled by pod."""
    zombies: Values = defaultdict(float)
    gpu_count: Values = defaultdict(float)
    gpu_bytes: Values = defaultdict(float)
    fd_only: Values = defaultdict(float)
    for row in scan.trace.rows:
        pod = _pod(PodLabels.of_row(row))
        if row.state == "Z":
            zombies[pod] += 1
        if row.nsmi:
            key = (*pod, str(row.gpu_index), row.gpu_uuid or "", row.verdict)
            gpu_count[key] += 1
            gpu_bytes[key] += _bytes(row.gpu_memory_mib)
        elif row.verdict == "fd-only":
            fd_only[(*pod, "" if row.gpu_index is None else str(row.gpu_index))] += 1
    gpu_labels = (*POD, *GPU, "verdict")
    yield _gauge("gpuzombie_zombies", "Processes in state Z on the node, by pod.", POD, zombies)
    yield _gauge("gpuzombie_gpu_processes", "Processes NVML lists, by pod, GPU and verdict (live, zombie, "
                 "gone, unresolved).", gpu_labels, gpu_count)
    yield _gauge("gpuzombie_gpu_process_memory_bytes", "GPU memory NVML attributes to processes, by pod, "
                 "GPU and verdict (0.1 MiB precision).", gpu_labels, gpu_bytes)
    yield _gauge("gpuzombie_fd_only_holders", "Processes holding /dev/nvidia* that NVML lists on no GPU "
                 "(NSMI=N), by pod and GPU node (empty: several or none).", (*POD, "gpu"), fd_only)


def namespace_metrics(scan: NodeScan) -> Iterator[Metric]:
    """PID 1, zombies by parent, orphans and grace risk of each PID namespace below the node's."""
    pid1: Values = defaultdict(float)
    by_parent: Values = defaultdict(float)
    orphans: Values = defaultdict(float)
    risk: Values = defaultdict(float)
    memory_by_ns: defaultdict[int, float] = defaultdict(float)
    for row in scan.trace.rows:
        inode = scan.namespaces.pidns_of.get(row.pid) if row.pid is not None else None
        if row.nsmi and inode is not None:
            memory_by_ns[inode] += _bytes(row.gpu_memory_mib)
    for ns in scan.namespaces.namespaces:
        pod = _pod(scan.labels(ns))
        pid1[(*pod, ns.pid1.program or "", ns.pid1.kind.value, str(ns.pid1.is_reaping_init).lower())] += 1
        for z in ns.zombies:
            by_parent[(*pod, z.parent_comm or "", str(z.ppid == 1).lower())] += 1
        for o in ns.orphans:
            orphans[(*pod, o.verdict)] += 1
        reason = ns.grace_risk
        if reason is not None and memory_by_ns[ns.inode]:
            risk[(*pod, reason)] += memory_by_ns[ns.inode]
    yield _gauge("gpuzombie_pid1_info", "PID 1 of each PID namespace below the node's: its program, "
                 "kind (init, pause, shell, non_forking, program, ...) and whether it reaps zombies; 1 a namespace "
                 "(more where the labels coincide, as for namespaces outside Kubernetes).",
                 (*POD, "program", "kind", "reaping"), pid1)
    yield _gauge("gpuzombie_zombies_by_parent", "Zombies inside each PID namespace by the parent that "
                 "has not reaped them (parent_is_pid1: the namespace's PID 1 never calls wait()).",
                 (*POD, "parent", "parent_is_pid1"), by_parent)
    yield _gauge("gpuzombie_orphans", "Live children of a namespace's PID 1 that it did not start "
                 "(verdict orphan), or that no evidence decides (cannot_tell).", (*POD, "verdict"), orphans)
    yield _gauge("gpuzombie_grace_risk_gpu_memory_bytes", "GPU memory a pod deletion would keep for the "
                 "whole grace period: SIGTERM to the container's PID 1 cannot end the processes holding it.",
                 (*POD, "reason"), risk)


def _baseline_source(g: GpuMemory) -> str:
    if g.baseline_source.startswith("NVML"):
        return "driver_reserved"
    return "given" if g.baseline_source.startswith("given") else "none"


def gpu_metrics(scan: NodeScan) -> Iterator[Metric]:
    """Each GPU's memory accounted for: used = baseline + processes + unexplained."""
    trace = scan.trace
    yield _gauge("gpuzombie_nvml_available", "1 when NVML answered the last scan, 0 when not (no driver, "
                 "no library, no GPU).", (), {(): float(trace.gpu.available)})
    total, used, processes, unexplained, baseline, verdict = (Values(float) for _ in range(6))
    for g in trace.gpus:
        key = (str(g.index), g.uuid)
        total[(*key, g.name)] = _bytes(g.total_mib)
        used[key] = _bytes(g.used_mib)
        processes[key] = _bytes(g.process_memory_mib)
        unexplained[key] = _bytes(g.unexplained_mib)
        baseline[(*key, _baseline_source(g))] = _bytes(g.baseline_mib)
        for v in VERDICTS:
            verdict[(*key, v)] = float(g.verdict == v)
    yield _gauge("gpuzombie_gpu_memory_total_bytes", "GPU memory size.", (*GPU, "model"), total)
    yield _gauge("gpuzombie_gpu_memory_used_bytes", "GPU memory used (total - free, driver reservation "
                 "included).", GPU, used)
    yield _gauge("gpuzombie_gpu_baseline_bytes", "Memory used with no process at all: the driver's "
                 "reservation (NVML v2 'reserved'), or --baseline-mib.", (*GPU, "source"), baseline)
    yield _gauge("gpuzombie_gpu_listed_process_memory_bytes", "Sum of the memory NVML attributes to "
                 "listed processes.", GPU, processes)
    yield _gauge("gpuzombie_gpu_unexplained_memory_bytes", "used - baseline - listed processes: ghost "
                 "memory when above the threshold.", GPU, unexplained)
    yield _gauge("gpuzombie_gpu_memory_verdict", "1 for the GPU's current verdict: ok, ghost (unexplained "
                 "above the threshold) or cannot_tell.", (*GPU, "verdict"), verdict)


def node_metrics(scan: NodeScan) -> Iterator[Metric]:
    yield from process_metrics(scan)
    yield from namespace_metrics(scan)
    yield from gpu_metrics(scan)
    warnings = len(scan.trace.warnings) + len(scan.namespaces.warnings)
    yield _gauge("gpuzombie_scan_warnings", "Warnings of the last scan (crictl missing, unreadable "
                 "namespaces, no NVML); their text goes to stderr each time it changes.", (),
                 {(): float(warnings)})
    yield _gauge("gpuzombie_pid_namespaces", "PID namespaces below the node's that were judged.", (),
                 {(): float(len(scan.namespaces.namespaces))})
