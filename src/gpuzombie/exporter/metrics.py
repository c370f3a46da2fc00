"""A NodeScan as Prometheus metric families. ``GAUGES`` names every node gauge once, with its help
text and labels; the README's metric table lists the same names (a test checks it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuzombie.escape import label_value
from gpuzombie.gpu.attribution import ProcessVerdict
from gpuzombie.gpu.nvml import MigInstance
from gpuzombie.handover.node import node_verdicts
from gpuzombie.k8s.owner import PodLabels
from gpuzombie.observe.orphans import ORPHAN
from gpuzombie.trace.model import GpuMemory
from gpuzombie.trace.scan import NodeScan
from gpuzombie.trace.stale import Dirty

POD = ("namespace", "pod", "pod_uid", "container")
"""Names as kube-state-metrics has them (join ``on(namespace, pod)``), and the pod's UID."""
GPU = ("gpu", "UUID", "Hostname")
"""dcgm-exporter's names: NVML index, ``GPU-…`` id, node name (join ``on(UUID)``)."""
MIG = ("GPU_I_ID", "GPU_I_PROFILE")
"""dcgm-exporter's names of a MIG GPU instance (join ``on(UUID, GPU_I_ID)``); absent without MIG, as
there: a sample whose MIG labels are empty leaves them out."""
DRA = ("dra_claim_name", "dra_claim_namespace", "dra_driver_name", "dra_pool_name", "dra_device_name")
"""dcgm-exporter's names of a DRA-allocated GPU (``--kubernetes-enable-dra``; join ``on(UUID, dra_claim_name)``)."""
Values = dict[tuple[str, ...], float]


@dataclass(frozen=True)
class Gauge:
    name: str
    labels: tuple[str, ...]
    doc: str


GAUGES = {
    g.name: g
    for g in (
        Gauge("gpuzombie_zombies", POD, "Processes in state Z on the node, by pod."),
        Gauge(
            "gpuzombie_gpu_processes",
            (*POD, *GPU, *MIG, "verdict"),
            "Processes NVML lists, by pod, GPU and verdict (live, zombie, gone, unresolved).",
        ),
        Gauge(
            "gpuzombie_gpu_process_memory_bytes",
            (*POD, *GPU, *MIG, "verdict"),
            "GPU memory NVML attributes to processes, by pod, GPU and verdict.",
        ),
        Gauge(
            "gpuzombie_fd_only_holders",
            (*POD, "gpu"),
            "Processes holding /dev/nvidia* that NVML lists on "
            "no GPU (NSMI=N), by pod and GPU node (empty: several or none).",
        ),
        Gauge(
            "gpuzombie_pid1_info",
            (*POD, "program", "kind", "reaping"),
            "PID 1 of each PID namespace below the node's that does not reap (reaping is always false) and "
            "holds a GPU or has a zombie or an orphan: its program and kind (shell, non_forking, program, "
            "...); 1 a namespace (more where the labels coincide, as for namespaces outside Kubernetes).",
        ),
        Gauge(
            "gpuzombie_pid1_kinds",
            ("kind", "reaping"),
            "PID namespaces below the node's by the kind of their PID 1 (init, supervisor, pause, shell, "
            "non_forking, program, unknown) and whether it reaps zombies.",
        ),
        Gauge(
            "gpuzombie_zombies_by_parent",
            (*POD, "parent", "parent_is_pid1"),
            "Zombies inside each PID "
            "namespace by the parent that has not reaped them (parent_is_pid1: the namespace's PID 1).",
        ),
        Gauge(
            "gpuzombie_orphans",
            (*POD, "verdict"),
            "Live children of a namespace's PID 1 that it did not start, by pod (verdict is always orphan).",
        ),
        Gauge(
            "gpuzombie_orphans_cannot_tell",
            (),
            "Live children of a namespace's PID 1 that no evidence decides for or against an orphan, summed "
            "over the node: the ordinary workers of multi-process pods, a count rather than a series a pod.",
        ),
        Gauge(
            "gpuzombie_grace_risk_gpu_memory_bytes",
            (*POD, "reason"),
            "GPU memory a pod deletion would keep "
            "for the whole grace period: SIGTERM to the container's PID 1 cannot end the processes holding it.",
        ),
        Gauge(
            "gpuzombie_nvml_available",
            (),
            "1 when NVML answered the last scan, 0 when not (no driver, no library, no GPU).",
        ),
        Gauge("gpuzombie_gpu_memory_total_bytes", (*GPU, *MIG, "model"), "GPU (or MIG instance) memory size."),
        Gauge(
            "gpuzombie_gpu_memory_used_bytes",
            (*GPU, *MIG),
            "GPU memory used (total - free, driver reservation included).",
        ),
        Gauge(
            "gpuzombie_gpu_baseline_bytes",
            (*GPU, *MIG, "source"),
            "Memory used with no process at all: the driver's reservation (NVML v2 'reserved'), or --baseline-mib.",
        ),
        Gauge(
            "gpuzombie_gpu_listed_process_memory_bytes",
            (*GPU, *MIG),
            "Sum of the memory NVML attributes to listed processes.",
        ),
        Gauge(
            "gpuzombie_gpu_unexplained_memory_bytes",
            (*GPU, *MIG),
            "used - baseline - listed processes: ghost memory when above the threshold.",
        ),
        Gauge(
            "gpuzombie_gpu_memory_verdict",
            (*GPU, *MIG, "verdict"),
            "1 on the GPU's current verdict: ok, ghost (unexplained above the threshold) or cannot_tell; the "
            "other two are absent (one series a GPU, not three).",
        ),
        Gauge(
            "gpuzombie_scan_warnings",
            (),
            "Warnings of the last scan (CRI runtime unreachable, unreadable namespaces, "
            "no NVML); their text goes to stderr each time it changes.",
        ),
        Gauge("gpuzombie_pid_namespaces", (), "PID namespaces below the node's that were judged."),
        # Whether each GPU is clean to hand to the next pod (issue 25): preflight's verdict, judged on the node.
        Gauge(
            "gpuzombie_gpu_handover_clean",
            (*GPU, *MIG),
            "1 when the GPU (or MIG instance) is clean to hand to the next pod, 0 when not (a process listed "
            "on it, or memory held beyond the driver's reservation): the verdict preflight gives in the pod; "
            "absent when NVML could not be read (gpuzombie_nvml_available).",
        ),
        Gauge(
            "gpuzombie_gpu_held_memory_bytes",
            (*GPU, *MIG, "holder"),
            "GPU memory held where it keeps the GPU from being handed out, by holder: stale (a pod the runtime "
            "no longer runs), foreign (a pod the kubelet did not give that GPU), dstate (a process in state D: "
            "reap cannot free it) or ghost (unexplained above the threshold, or listed for a pid that exited); "
            "a series only while above 0.",
        ),
        # Dirty GPUs (trace.stale): holders in a pod the runtime no longer runs, or not given that GPU.
        Gauge(
            "gpuzombie_dirty_gpu_holders",
            (*POD, *GPU, "kind"),
            "Processes holding GPU memory or /dev/nvidia* where they should not: kind stale (in the cgroup "
            "of a pod the runtime no longer runs or lists as not ready) or foreign (NVML lists it on a GPU "
            "the kubelet gave to other pods); gpu/UUID empty for an fd holder of several or no GPU nodes.",
        ),
        Gauge(
            "gpuzombie_dirty_gpu_memory_bytes",
            (*POD, *GPU, "kind"),
            "GPU memory NVML attributes to those processes (0 for fd-only holders).",
        ),
        Gauge(
            "gpuzombie_dirty_gpu_check",
            ("kind",),
            "1 when the last scan could judge that kind: stale needs the runtime's pod list (read each scan), "
            "foreign the kubelet's PodResources; 0 when not (then none of that kind is reported).",
        ),
        Gauge(
            "gpuzombie_dra_gpu_allocation",
            ("namespace", "pod", "container", *GPU, *MIG, *DRA),
            "1 for each GPU (or MIG instance) the kubelet gave a container through a DRA claim, with "
            "dcgm-exporter's dra_* labels: joins the per-pod series to the claim (group_left).",
        ),
        Gauge(
            "gpuzombie_unreadable_processes",
            ("reason",),
            "Processes the last scan could not read where that could hide a GPU holder, zombie or "
            "orphan from the other gauges, by reason: access_denied, or incomplete (a file missing, not "
            "a regular file, over its size cap or malformed, or the scan's deadline passed first).",
        ),
        # D-state GPU holders (issue 20, item 3).
        Gauge(
            "gpuzombie_dstate_gpu_holders",
            POD,
            "Processes in state D (uninterruptible) that NVML lists with GPU memory or that hold /dev/nvidia*, by pod.",
        ),
        Gauge(
            "gpuzombie_dstate_gpu_memory_bytes",
            POD,
            "GPU memory NVML attributes to processes in state D, by pod: freed only when they leave D.",
        ),
        Gauge(
            "gpuzombie_dstate_seconds",
            POD,
            "How long the pod's longest-stuck D-state GPU holder has been seen in D across the exporter's scans "
            "(a process is its pid and start time; 0 at the first scan that sees it, anew when it leaves D or its "
            "pid is reused); `gpuzombie trace` on the node names the processes.",
        ),
    )
}


def _family(name: str, values: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    """The gauge's samples, grouped on the label values as served (escaped and capped first, so
    no two samples can carry the same labels; label_value keeps values apart past the cap)."""
    spec = GAUGES[name]
    family = GaugeMetricFamily(name, spec.doc, labels=list(spec.labels))
    served: defaultdict[tuple[str, ...], float] = defaultdict(float)
    for key, value in values.items():
        served[tuple(label_value(v) for v in key)] += value
    for served_key, value in sorted(served.items()):
        labels = dict(zip(spec.labels, served_key, strict=True))
        family.add_sample(name, {k: v for k, v in labels.items() if v or k not in MIG}, value)
    return family


def _mig(mig: MigInstance | None) -> tuple[str, str]:
    return (str(mig.gpu_instance_id), mig.profile) if mig else ("", "")


def _pod(labels: PodLabels) -> tuple[str, str, str, str]:
    return (labels.namespace, labels.pod, labels.pod_uid, labels.container)


def process_metrics(scan: NodeScan) -> dict[str, Values]:
    """Zombies, GPU processes and fd-only holders from the trace rows, labelled by pod."""
    out: dict[str, Values] = defaultdict(lambda: defaultdict(float))
    for row in scan.trace.rows:
        pod = _pod(scan.row_labels(row))
        if row.state == "Z":
            out["gpuzombie_zombies"][pod] += 1
        if row.nsmi:
            key = (*pod, str(row.gpu_index), row.gpu_uuid or "", scan.node_name, *_mig(row.mig), row.verdict)
            out["gpuzombie_gpu_processes"][key] += 1
            out["gpuzombie_gpu_process_memory_bytes"][key] += row.gpu_memory or 0
        elif row.verdict == "fd-only":
            out["gpuzombie_fd_only_holders"][(*pod, "" if row.gpu_index is None else str(row.gpu_index))] += 1
    return out


def namespace_metrics(scan: NodeScan) -> dict[str, Values]:
    """Zombies by parent, orphans and grace risk of each PID namespace below the node's; PID 1 kinds
    counted, and named (``gpuzombie_pid1_info``) only for a non-reaping PID 1 with a GPU or a finding."""
    out: dict[str, Values] = defaultdict(lambda: defaultdict(float))
    memory_by_ns: defaultdict[int, int] = defaultdict(int)
    gpu_holding: set[int] = set()
    for row in scan.trace.rows:
        inode = scan.namespaces.pidns_of.get(row.pid) if row.pid is not None else None
        if inode is not None and (row.nsmi or row.verdict == "fd-only"):
            gpu_holding.add(inode)
            memory_by_ns[inode] += row.gpu_memory or 0
    out["gpuzombie_orphans_cannot_tell"][()] = 0.0
    for ns in scan.namespaces.namespaces:
        pod = _pod(scan.labels(ns))
        reaping = str(ns.pid1.is_reaping_init).lower()
        out["gpuzombie_pid1_kinds"][(ns.pid1.kind.value, reaping)] += 1
        for z in ns.zombies:
            out["gpuzombie_zombies_by_parent"][(*pod, z.parent_comm or "", str(z.ppid == 1).lower())] += 1
        orphans = sum(o.verdict == ORPHAN for o in ns.orphans)
        if orphans:
            out["gpuzombie_orphans"][(*pod, ORPHAN)] += orphans
        out["gpuzombie_orphans_cannot_tell"][()] += len(ns.orphans) - orphans
        if not ns.pid1.is_reaping_init and (ns.inode in gpu_holding or ns.zombies or orphans):
            # Only where it matters (the alerts' joins, the dashboard's table): a series a pod otherwise.
            out["gpuzombie_pid1_info"][(*pod, ns.pid1.program or "", ns.pid1.kind.value, reaping)] += 1
        reason = ns.grace_risk
        if reason is not None and memory_by_ns[ns.inode]:
            out["gpuzombie_grace_risk_gpu_memory_bytes"][(*pod, reason)] += memory_by_ns[ns.inode]
    return out


def _baseline_source(g: GpuMemory) -> str:
    if g.baseline_source.startswith("NVML"):
        return "driver_reserved"
    return "given" if g.baseline_source.startswith("given") else "none"


def gpu_metrics(scan: NodeScan) -> dict[str, Values]:
    """Each GPU's memory accounted for: used = baseline + processes + unexplained."""
    out: dict[str, Values] = defaultdict(lambda: defaultdict(float))
    out["gpuzombie_nvml_available"][()] = float(scan.trace.gpu.available)
    for g in scan.trace.gpus:
        key = (str(g.index), g.uuid, scan.node_name, *_mig(g.mig))
        out["gpuzombie_gpu_memory_total_bytes"][(*key, g.name)] = g.total
        out["gpuzombie_gpu_memory_used_bytes"][key] = g.used
        out["gpuzombie_gpu_baseline_bytes"][(*key, _baseline_source(g))] = g.baseline
        out["gpuzombie_gpu_listed_process_memory_bytes"][key] = g.process_memory
        out["gpuzombie_gpu_unexplained_memory_bytes"][key] = g.unexplained
        out["gpuzombie_gpu_memory_verdict"][(*key, g.verdict)] = 1.0
    return out


def handover_metrics(scan: NodeScan) -> dict[str, Values]:
    """Each GPU's handover verdict (``handover.node``: preflight's, on the node's NVML reading) and the
    memory its stale, foreign, D-state and ghost holders keep: each byte under one holder, a D-state
    process's as dstate whatever its pod; ghost both the unexplained memory and what NVML lists for a
    pid that has exited (zombie) or is gone."""
    out: dict[str, Values] = defaultdict(lambda: defaultdict(float))
    held = out["gpuzombie_gpu_held_memory_bytes"]
    for row in scan.trace.rows:
        holder = "dstate" if row.state == "D" else row.dirty.value if row.dirty else None
        if row.verdict in (ProcessVerdict.GONE.value, ProcessVerdict.ZOMBIE.value) and holder is None:
            holder = "ghost"  # NVML's memory of a pid that exited: the seed's orphaned context
        if row.nsmi and row.gpu_memory and row.gpu_uuid and holder in ("dstate", "stale", "foreign", "ghost"):
            held[(str(row.gpu_index), row.gpu_uuid, scan.node_name, *_mig(row.mig), holder)] += row.gpu_memory
    for memory, verdict in node_verdicts(scan):
        key = (str(memory.index), memory.uuid, scan.node_name, *_mig(memory.mig))
        out["gpuzombie_gpu_handover_clean"][key] = float(verdict.clean)
        if memory.flagged and memory.unexplained > 0:
            held[(*key, "ghost")] = memory.unexplained
    return out


def unreadable_metrics(scan: NodeScan) -> Values:
    """Processes of the node that could not be read where that could hide a finding (the same ones
    that keep trace from saying healthy), access-denied told apart."""
    shown = {row.pid for row in scan.trace.rows if row.pid is not None}
    unverified = scan.table.unverified(shown)
    denied = sum(p.access_denied for p in unverified)
    return {
        ("access_denied",): float(denied),
        ("incomplete",): float(len(unverified) - denied + len(scan.table.unread)),
    }


def dstate_metrics(scan: NodeScan) -> dict[str, Values]:
    """The D-state GPU holders by pod, their memory, and how long the longest-stuck has been seen in D
    (no pid or comm label: a series per stuck process would never end)."""
    out: dict[str, Values] = defaultdict(lambda: defaultdict(float))
    for h in scan.trace.d_state:
        pod = _pod(scan.owners.of(h.pid).labels)
        out["gpuzombie_dstate_gpu_holders"][pod] += 1
        out["gpuzombie_dstate_gpu_memory_bytes"][pod] += h.gpu_memory
        seconds = max(0.0, scan.d_state_seconds.get(h.identity, 0.0))
        out["gpuzombie_dstate_seconds"][pod] = max(out["gpuzombie_dstate_seconds"].get(pod, 0.0), seconds)
    return out


def dirty_metrics(scan: NodeScan) -> dict[str, Values]:
    """Stale and foreign GPU holders by pod and GPU, which of the two checks the scan could make, and
    the DRA allocations the foreign check judged by."""
    out: dict[str, Values] = defaultdict(lambda: defaultdict(float))
    for row in scan.trace.rows:
        if row.dirty is None or row.dirty not in (Dirty.STALE, Dirty.FOREIGN):
            continue
        gpu = "" if row.gpu_index is None else str(row.gpu_index)
        key = (*_pod(scan.row_labels(row)), gpu, row.gpu_uuid or "", scan.node_name, row.dirty.value)
        out["gpuzombie_dirty_gpu_holders"][key] += 1
        out["gpuzombie_dirty_gpu_memory_bytes"][key] += row.gpu_memory or 0
    for g in scan.trace.gpus:
        for a in g.allocated_to:
            if a.claim is not None:
                c = a.claim
                dra = (c.claim_name, c.claim_namespace, c.driver, c.pool, c.device)
                where = (a.namespace, a.pod, a.container, str(g.index), g.uuid, scan.node_name, *_mig(g.mig))
                out["gpuzombie_dra_gpu_allocation"][(*where, *dra)] = 1.0
    checks = scan.trace.checks
    out["gpuzombie_dirty_gpu_check"].update({("stale",): float(checks.stale), ("foreign",): float(checks.foreign)})
    return out


def node_metrics(scan: NodeScan) -> Iterator[Metric]:
    """Every gauge of GAUGES, in its order; those with no sample still carry HELP and TYPE."""
    values = {
        **process_metrics(scan),
        **namespace_metrics(scan),
        **gpu_metrics(scan),
        **dstate_metrics(scan),
        **dirty_metrics(scan),
        **handover_metrics(scan),
    }
    values["gpuzombie_scan_warnings"] = {(): float(len(scan.trace.warnings) + len(scan.namespaces.warnings))}
    values["gpuzombie_pid_namespaces"] = {(): float(len(scan.namespaces.namespaces))}
    values["gpuzombie_unreadable_processes"] = unreadable_metrics(scan)
    for name in GAUGES:
        yield _family(name, values.get(name, {}))
