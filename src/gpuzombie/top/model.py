"""The view model of ``gpuzombie top``: one node scan (``trace.scan``) turned into groups per GPU or
MIG instance, the pods holding each, and their processes; sorting and filtering are pure functions
of it, so the Textual app, ``--once`` and the tests all see the same frame.

Everything a container controls (comm, cmdline, names the runtime gives) is escaped here, once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuzombie.escape import escape
from gpuzombie.gpu.nvml import GpuDevice
from gpuzombie.handover.verdict import GpuReading, judge
from gpuzombie.jsonout import IN_MIB, SchemaReport
from gpuzombie.k8s.liveness import PodState, RuntimePods
from gpuzombie.observe.namespaces import NamespaceScan
from gpuzombie.pid1kinds import Pid1Kind
from gpuzombie.proc.procfs import ProcessInfo
from gpuzombie.trace.model import GpuMemory, TraceReport, TraceRow
from gpuzombie.trace.scan import NodeScan
from gpuzombie.trace.stale import Dirty

SCHEMA = "gpuzombie.top/1"
SORT_KEYS = ("memory", "zombies", "age", "name")
"""What pods can be sorted by: GPU memory held, zombies + orphans, age (oldest process), name."""
HOST = "host"
"""The group and pseudo-pod of processes in no pod (they hold a GPU or are zombies)."""
NO_GPU_GROUP = "no GPU"
"""The group of pods that hold no GPU (their zombies, orphans and PID 1 still matter)."""
_CMDLINE_LIMIT = 160
_NAME_LIMIT = 80


@dataclass(frozen=True)
class ProcessLine:
    """One process of a pod (or of the host group)."""

    pid: int
    """The pid in the procfs read (the host pid on a node)."""
    nspid: int
    """The pid inside its own PID namespace."""
    ppid: int
    start_ticks: int
    """With ``pid``: the process's identity, what an action pins through a pidfd."""
    state: str
    comm: str
    command: str
    """Escaped and bounded."""
    container: str
    gpu_memory: int = field(metadata=IN_MIB)
    gpus: tuple[int, ...]
    age_s: float
    d_state_s: float | None = None
    """Seconds seen in D while holding a GPU (``DStateTracker``); None when not such a holder."""
    dirty: str | None = None
    """stale, foreign or unknown (``trace.stale``)."""
    depth: int = 0
    """Its depth in the pod's process tree (0: a root of the pod's processes)."""


@dataclass(frozen=True)
class PodLine:
    """One pod on one GPU group: what gpuzombie alone knows about it."""

    key: str
    """The pod's UID; ``HOST`` for the host pseudo-pod."""
    namespace: str
    pod: str
    containers: tuple[str, ...]
    gpu_memory: int = field(metadata=IN_MIB)
    """Bytes NVML attributes to its processes on this group's GPU (all GPUs in ``NO_GPU_GROUP``: 0)."""
    gpus: tuple[int, ...]
    """Every GPU index its processes are listed on or hold a device node of."""
    processes: tuple[ProcessLine, ...]
    """Tree order (parents before children, siblings by pid)."""
    pid1: str
    """Its PID 1s by container: ``tini (init)``; empty when none was judged."""
    reaps: bool | None
    """Every PID 1 of it reaps (None: no PID namespace of it was judged)."""
    zombies: int
    orphans: int
    d_state: int
    d_state_max_s: float | None
    dirty: str | None
    """The worst mark of its GPU holders: stale, foreign, unknown."""
    grace_risk: str | None
    runtime_state: str
    """running, not_ready, not_listed, unknown (the runtime's answer), or "" for the host."""
    stopping_s: float | None
    """Seconds since top first saw the runtime call it stopped (not ready / not listed)."""
    age_s: float

    @property
    def label(self) -> str:
        if self.namespace and self.pod:
            return f"{self.namespace}/{self.pod}"
        return self.pod or self.namespace or self.key


@dataclass(frozen=True)
class GpuGroup:
    key: str
    """``0``, ``0/mig1`` (GPU 0, GPU instance 1), ``host`` or ``no GPU``."""
    title: str
    memory: GpuMemory | None
    """The trace's accounting of this GPU or MIG instance; None for host / no-GPU groups, or without NVML."""
    handover: str
    """Clean to hand out, by ``handover.verdict.judge`` (what preflight and the exporter say): clean;
    else dirty (ghost memory, a stale or foreign holder, memory held with no process listed), in
    use (NVML lists its processes, nothing else wrong), cannot tell (NVML not read: never clean);
    "" for the host and no-GPU groups."""
    pods: tuple[PodLine, ...]
    handover_reason: str = ""
    """The verdict's one line: why it is clean, or what keeps it from being."""


@dataclass(frozen=True)
class NodeView(SchemaReport):
    node: str
    nvml: str
    """"ok (driver V)" or why NVML could not be read (processes are still shown)."""
    groups: tuple[GpuGroup, ...]
    warnings: tuple[str, ...]
    scan_s: float
    pods: int
    processes: int


class StoppingTracker:
    """When top first saw each pod stopped by the runtime's word (not ready or no longer listed).

    The CRI carries no deletion timestamp; this is the time since the first scan that saw it so,
    kept while every scan does (a pod seen running again starts anew)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[str, float] = {}

    def update(self, stopping: Iterable[str]) -> Mapping[str, float]:
        now = self._clock()
        self._since = {uid: self._since.get(uid, now) for uid in stopping}
        return {uid: now - since for uid, since in self._since.items()}


def _gpu_key(index: int | None, row_mig: Any) -> str:
    if index is None:
        return ""
    return f"{index}/mig{row_mig.gpu_instance_id}" if row_mig is not None else str(index)


def _gpu_title(memory: GpuMemory) -> str:
    where = f"GPU {memory.index}"
    if memory.mig is not None:
        where += f" MIG {escape(memory.mig.profile, 32)} (GI {memory.mig.gpu_instance_id})"  # as trace writes it
    return f"{where} {escape(memory.name, _NAME_LIMIT)} {memory.uuid}"


def _handover(device: GpuDevice | None, memory: GpuMemory | None, rows: list[TraceRow], why: str) -> tuple[str, str]:
    """The handover verdict of one GPU group and its one line; ``why`` NVML could not be read."""
    if device is None or memory is None:
        return "cannot tell", judge(None, error=why).reason
    reading = GpuReading(device.memory_used, device.memory_reserved, len(device.processes), device.processes_read)
    verdict = judge(reading, baseline_bytes=memory.baseline)
    if verdict.clean:
        label = "clean"
    elif not device.processes_read:
        label = "cannot tell"
    elif memory.flagged or any(r.dirty in (Dirty.STALE, Dirty.FOREIGN) for r in rows):
        label = "dirty"  # ghost memory beside its processes, or a holder that should be gone
    else:
        label = "in use" if device.processes else "dirty"
    return label, verdict.reason


@dataclass
class _PodAcc:
    """A pod's facts gathered over the scan, before it is frozen into PodLines."""

    key: str
    namespace: str = ""
    pod: str = ""
    containers: dict[str, None] = field(default_factory=dict)
    procs: list[tuple[ProcessInfo, str]] = field(default_factory=list)
    namespaces: list[tuple[str, NamespaceScan]] = field(default_factory=list)


def _tree(procs: list[tuple[ProcessInfo, str]]) -> list[tuple[ProcessInfo, str, int]]:
    """Parents before children, with their depth; siblings by pid; roots: those whose parent is not listed."""
    pids = {p.pid for p, _ in procs}
    children: dict[int, list[tuple[ProcessInfo, str]]] = {}
    for p, c in procs:
        children.setdefault(p.ppid if p.ppid in pids and p.ppid != p.pid else -1, []).append((p, c))
    for kids in children.values():
        kids.sort(key=lambda pc: pc[0].pid, reverse=True)
    ordered: list[tuple[ProcessInfo, str, int]] = []
    stack = [(p, c, 0) for p, c in children.get(-1, [])]
    seen: set[int] = set()
    while stack:
        p, c, depth = stack.pop()
        if p.pid not in seen:
            seen.add(p.pid)
            ordered.append((p, c, depth))
            stack.extend((k, kc, depth + 1) for k, kc in children.get(p.pid, []))
    return ordered


def _pods(scan: NodeScan) -> tuple[dict[str, _PodAcc], _PodAcc]:
    """Every pod's processes, by their owner (``k8s.owner``); the host pseudo-pod: the processes in
    no pod that a trace row shows (they hold a GPU or are zombies)."""
    accs: dict[str, _PodAcc] = {}
    host = _PodAcc(HOST, namespace=HOST)
    row_pids = {r.pid for r in scan.trace.rows if r.pid is not None}
    for proc in scan.table:
        owner = scan.owners.of(proc.pid)
        uid = owner.ref.pod_uid if owner.ref else None
        if not uid:
            if proc.pid in row_pids:
                host.procs.append((proc, ""))
            continue
        acc = accs.setdefault(uid, _PodAcc(uid))
        acc.namespace = acc.namespace or owner.namespace or ""
        acc.pod = acc.pod or owner.pod or ""
        if owner.container_label:
            acc.containers[owner.container_label] = None
        acc.procs.append((proc, owner.container_label))
    for ns in scan.namespaces.namespaces:
        uid = ns.container.pod_uid if ns.container else None
        if uid and uid in accs:
            accs[uid].namespaces.append((scan.labels(ns).container, ns))
    return accs, host


@dataclass
class _GpuFacts:
    """What the trace rows say about each pid: the groups and GPUs it is on, its memory by group,
    its mark; and each group's rows."""

    memory_of: dict[int, dict[str, int]] = field(default_factory=dict)
    dirty_of: dict[int, str] = field(default_factory=dict)
    groups_of: dict[int, set[str]] = field(default_factory=dict)
    gpus_of: dict[int, set[int]] = field(default_factory=dict)
    rows_by_group: dict[str, list[TraceRow]] = field(default_factory=dict)

    def on(self, pid: int, key: str, gpu: int) -> None:
        self.groups_of.setdefault(pid, set()).add(key)
        self.gpus_of.setdefault(pid, set()).add(gpu)


def _gpu_facts(trace: TraceReport) -> _GpuFacts:
    facts = _GpuFacts()
    index_keys: dict[int, str] = {}
    for m in trace.gpus:
        index_keys.setdefault(m.index, _gpu_key(m.index, m.mig))
    for r in trace.rows:
        if r.gpu_index is None:
            continue
        key = _gpu_key(r.gpu_index, r.mig) if r.nsmi else index_keys.get(r.gpu_index, _gpu_key(r.gpu_index, r.mig))
        facts.rows_by_group.setdefault(key, []).append(r)
        if r.pid is None:
            continue
        facts.on(r.pid, key, r.gpu_index)
        if r.gpu_memory:
            bucket = facts.memory_of.setdefault(r.pid, {})
            bucket[key] = bucket.get(key, 0) + r.gpu_memory
        if r.dirty:
            facts.dirty_of[r.pid] = r.dirty.value
    for r in trace.rows:  # fd holders of several GPUs: every /dev/nvidiaN they hold
        if r.pid is not None and not r.nsmi:
            for dev in r.devices:
                tail = dev.removeprefix("/dev/nvidia")
                if tail.isdigit():
                    facts.on(r.pid, index_keys.get(int(tail), tail), int(tail))
    return facts


@dataclass(frozen=True)
class _Frame:
    """One scan's facts that every pod line reads."""

    facts: _GpuFacts
    in_d: Mapping[int, float]
    pods: RuntimePods | None
    stopping_s: Mapping[str, float]
    now: float


def _line(frame: _Frame, proc: ProcessInfo, container: str, depth: int, group: str | None) -> ProcessLine:
    mem = frame.facts.memory_of.get(proc.pid, {})
    return ProcessLine(
        pid=proc.pid,
        nspid=proc.innermost_pid,
        ppid=proc.ppid,
        start_ticks=proc.start_ticks,
        state=proc.state,
        comm=escape(proc.comm, 32),
        command=escape(proc.command, _CMDLINE_LIMIT),
        container=escape(container, _NAME_LIMIT),
        gpu_memory=mem.get(group, 0) if group is not None else sum(mem.values()),
        gpus=tuple(sorted(frame.facts.gpus_of.get(proc.pid, ()))),
        age_s=max(0.0, frame.now - proc.start_time),
        d_state_s=frame.in_d.get(proc.pid),
        dirty=frame.facts.dirty_of.get(proc.pid),
        depth=depth,
    )


_WORST = (Dirty.STALE.value, Dirty.FOREIGN.value, Dirty.UNKNOWN.value)


def _pod_line(frame: _Frame, acc: _PodAcc, group: str | None) -> PodLine:
    procs = [_line(frame, p, c, depth, group) for p, c, depth in _tree(acc.procs)]
    marks = {p.dirty for p in procs if p.dirty}
    d_ages = [p.d_state_s for p in procs if p.d_state_s is not None]
    scans = [ns for _, ns in acc.namespaces]
    pid1 = ", ".join(
        f"{escape(c, _NAME_LIMIT) + ': ' if c and len(acc.namespaces) > 1 else ''}"
        f"{escape(ns.pid1.program or '?', 32)} ({ns.pid1.kind.value})"
        for c, ns in acc.namespaces
        if ns.pid1.kind is not Pid1Kind.PAUSE or len(acc.namespaces) == 1
    )
    risks = sorted({r for ns in scans if (r := ns.grace_risk)})
    pods = frame.pods
    state = "" if acc.key == HOST else (pods.state(acc.key).value if pods is not None else "")
    return PodLine(
        key=acc.key,
        namespace=escape(acc.namespace, _NAME_LIMIT),
        pod=escape(acc.pod, _NAME_LIMIT) if acc.pod else (acc.key[:13] if acc.key != HOST else ""),
        containers=tuple(escape(c, _NAME_LIMIT) for c in acc.containers),
        gpu_memory=sum(p.gpu_memory for p in procs),
        gpus=tuple(sorted({g for p in procs for g in p.gpus})),
        processes=tuple(procs),
        pid1=pid1,
        reaps=all(ns.pid1.is_reaping_init for ns in scans) if scans else None,
        zombies=sum(len(ns.zombies) for ns in scans) if scans else sum(p.state == "Z" for p in procs),
        orphans=sum(len(ns.orphans) for ns in scans),
        d_state=len(d_ages),
        d_state_max_s=max(d_ages) if d_ages else None,
        dirty=next((m for m in _WORST if m in marks), None),
        grace_risk=", ".join(risks) or None,
        runtime_state=state,
        stopping_s=frame.stopping_s.get(acc.key),
        age_s=max((p.age_s for p in procs), default=0.0),
    )


def build_view(
    scan: NodeScan,
    *,
    pods: RuntimePods | None = None,
    stopping: StoppingTracker | None = None,
    now: float | None = None,
) -> NodeView:
    """The frame of one scan: ``pods`` is the runtime's answer the scan's stale check got."""
    trace = scan.trace
    accs, host = _pods(scan)
    facts = _gpu_facts(trace)
    stopped = {uid for uid in accs if pods is not None and pods.state(uid) in (PodState.NOT_READY, PodState.NOT_LISTED)}
    frame = _Frame(
        facts=facts,
        in_d={h.pid: scan.d_state_seconds.get(h.identity, 0.0) for h in trace.d_state},
        pods=pods,
        stopping_s=(stopping or StoppingTracker()).update(stopped),
        now=trace.taken_at if now is None else now,
    )
    pod_groups = {a.key: {g for p, _ in a.procs for g in facts.groups_of.get(p.pid, ())} for a in accs.values()}

    def pod_lines(key: str) -> tuple[PodLine, ...]:
        return tuple(_pod_line(frame, a, key) for a in accs.values() if key in pod_groups[a.key])

    groups: list[GpuGroup] = []
    unread = escape(trace.gpu.reason or "NVML not read", 200)
    devices: Iterable[GpuDevice | None] = scan.gpus.devices if scan.gpus.devices else (None for _ in trace.gpus)
    for device, m in zip(devices, trace.gpus, strict=True):
        key = _gpu_key(m.index, m.mig)
        label, reason = _handover(device, m, facts.rows_by_group.get(key, []), unread)
        groups.append(GpuGroup(key, _gpu_title(m), m, label, pod_lines(key), reason))
    known = {g.key for g in groups}
    for key in sorted({g for gs in pod_groups.values() for g in gs} - known):  # no NVML: /dev/nvidiaN only
        title = f"GPU {key} (from /dev/nvidia{key}; NVML not read)"
        label, reason = _handover(None, None, [], unread)
        groups.append(GpuGroup(key, title, None, label, pod_lines(key), reason))
    if host.procs:
        groups.append(
            GpuGroup(HOST, "host processes holding GPUs (or zombies)", None, "", (_pod_line(frame, host, None),))
        )
    idle = [a for a in accs.values() if not pod_groups[a.key]]
    if idle:
        groups.append(
            GpuGroup(NO_GPU_GROUP, "pods holding no GPU", None, "", tuple(_pod_line(frame, a, None) for a in idle))
        )
    gpu = trace.gpu
    return NodeView(
        schema=SCHEMA,
        taken_at=frame.now,
        node=escape(scan.node_name, _NAME_LIMIT),
        nvml=f"ok (driver {gpu.driver_version})" if gpu.available else f"absent ({gpu.reason}): processes only",
        groups=tuple(groups),
        warnings=tuple(escape(w, 1000) for w in (*trace.warnings, *scan.namespaces.warnings)),
        scan_s=scan.duration_s,
        pods=len(accs),
        processes=len(scan.table),
    )


def _sort_key(sort: str) -> Callable[[PodLine], Any]:
    if sort == "memory":
        return lambda p: (-p.gpu_memory, p.label)
    if sort == "zombies":
        return lambda p: (-(p.zombies + p.orphans), -p.gpu_memory, p.label)
    if sort == "age":
        return lambda p: (-p.age_s, p.label)
    if sort == "name":
        return lambda p: p.label
    raise ValueError(f"sort by one of {', '.join(SORT_KEYS)}, not {sort!r}")


def _matches(pod: PodLine, text: str) -> bool:
    needle = text.lower()
    fields = (pod.namespace, pod.pod, pod.key, pod.pid1, *pod.containers)
    if any(needle in f.lower() for f in fields):
        return True
    return any(needle in p.command.lower() or needle == str(p.pid) for p in pod.processes)


def arrange(view: NodeView, *, sort: str = "memory", namespace: str = "", text: str = "") -> NodeView:
    """``view`` with each group's pods sorted by ``sort`` and only those in ``namespace`` (exact)
    and matching ``text`` (a substring of names, PID 1, a command line, or an exact pid) kept;
    groups left empty are dropped, GPU groups kept (an idle GPU is worth seeing)."""
    key = _sort_key(sort)
    groups = []
    for g in view.groups:
        kept = [p for p in g.pods if (not namespace or p.namespace == namespace) and (not text or _matches(p, text))]
        if kept or g.memory is not None:
            groups.append(dataclasses.replace(g, pods=tuple(sorted(kept, key=key))))
    return dataclasses.replace(view, groups=tuple(groups))


def namespaces_of(view: NodeView) -> tuple[str, ...]:
    """The namespaces of its pods, sorted: what the namespace filter cycles through."""
    return tuple(sorted({p.namespace for g in view.groups for p in g.pods if p.key != HOST}))
