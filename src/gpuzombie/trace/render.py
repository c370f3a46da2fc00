"""The trace report as the original experiment's table, plus one accounting line per GPU."""

from __future__ import annotations

from gpuzombie.escape import escape
from gpuzombie.k8s.owner import UNREAD_CGROUP
from gpuzombie.trace.model import TraceReport, TraceRow
from gpuzombie.trace.stale import Dirty
from gpuzombie.units import MIB

HOLDER_MARKS = {"stale": "STALE", "foreign": "FOREIGN"}
COLUMNS = ("PID", "NSPID", "STATE", "GPU", "GPU_MEM", "NSMI", "QOS", "POD", "NAMESPACE", "CONTAINER")


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f} MiB"


def _gpu(row: TraceRow) -> str:
    if row.gpu_index is not None:
        return str(row.gpu_index) + (f"/GI{row.mig.gpu_instance_id}" if row.mig else "")
    nodes = [d.removeprefix("/dev/nvidia") for d in row.devices if d.removeprefix("/dev/nvidia").isdigit()]
    return ",".join(nodes) or "-"


def _cells(row: TraceRow) -> tuple[str, ...]:
    # Without names, ids: a pod UID and a short container id still let a person find them.
    pod = row.pod or row.pod_uid or "-"
    container = row.container or (row.container_id[:13] if row.container_id else None)
    if container is None and "cgroup" in row.unread:
        container = UNREAD_CGROUP
    elif container is None:
        container = "(host)" if row.pod_uid is None and row.state != "-" else "-"
    return (
        "-" if row.pid is None else str(row.pid),
        "-" if row.nspid is None else str(row.nspid),
        row.state,
        _gpu(row),
        _mib(row.gpu_memory),
        "Y" if row.nsmi else "N",
        row.qos or "-",
        pod,
        row.namespace or "-",
        container,
    )


def _d_state_lines(report: TraceReport) -> list[str]:
    """One line per GPU holder in state D, with its pod from its row."""
    rows = {r.pid: r for r in report.rows if r.pid is not None}
    out = []
    for h in report.d_state:
        row = rows.get(h.pid)
        where = f" in pod {row.namespace}/{row.pod or row.pod_uid}" if row and (row.pod or row.pod_uid) else ""
        held = f"{_mib(h.gpu_memory)} on GPU {','.join(map(str, h.gpus))}" if h.gpus else "no memory NVML lists"
        devices = f", holds {' '.join(h.devices)}" if h.devices else ""
        out.append(
            f"D state: pid {h.pid} ({escape(h.comm)}){escape(where, 300)}: {held}{escape(devices, 300)}; "
            "uninterruptible, SIGKILL waits; if it stays in D only a drain or reboot frees the GPU"
        )
    return out


def table(rows: list[tuple[str, ...]]) -> str:
    rows = [tuple(escape(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def render_text(report: TraceReport) -> str:
    out = []
    dirty = [r for r in report.rows if r.dirty]
    if dirty:  # a HOLDER column only where there is something to say: STALE, FOREIGN, unknown
        cells = [(*_cells(r), HOLDER_MARKS.get(r.dirty.value, r.dirty.value) if r.dirty else "-") for r in report.rows]
        out.append(table([(*COLUMNS, "HOLDER"), *cells]))
    elif report.rows:
        out.append(table([COLUMNS, *(_cells(r) for r in report.rows)]))
    else:
        out.append("no GPU process, /dev/nvidia* holder or zombie on this node")
    out += _d_state_lines(report)
    if report.gpu.available:
        out.append("")
        for g in report.gpus:
            mark = {"ok": "ok", "ghost": "GHOST", "cannot_tell": "cannot tell"}.get(g.verdict, g.verdict)
            instance = f" MIG {escape(g.mig.profile)} (GI {g.mig.gpu_instance_id})" if g.mig else ""
            out.append(
                f"GPU {g.index}{instance} {escape(g.name)} ({escape(g.uuid)}): used {_mib(g.used)} = baseline "
                f"{_mib(g.baseline)} + processes {_mib(g.process_memory)} + unexplained "
                f"{_mib(g.unexplained)}  [{mark}]"
            )
            for cause in g.likely_causes:
                out.append(f"  likely cause: {escape(cause, 1000)}")
            if g.allocated_to and not g.likely_causes:
                allocated = ", ".join(f"{a.namespace}/{a.pod}/{a.container}" for a in g.allocated_to)
                out.append("  allocated to: " + escape(allocated, 1000))
        out.append(f"note: {report.baseline_note}")
    for r in dirty:
        if r.dirty is not None and r.dirty != Dirty.UNKNOWN:
            where = f"GPU {_gpu(r)}" + (f", {_mib(r.gpu_memory)}" if r.gpu_memory else "")
            out.append(
                f"{r.dirty.value}: pid {r.pid} ({escape(r.comm or '?')}) holds {where}: {escape(r.dirty_reason or '')}"
            )
    s = report.summary
    findings = s.zombies or s.gone or s.ghost_gpus or s.stale or s.foreign
    verdict = "healthy" if s.healthy else "findings" if findings else "incomplete (not verified)"
    out.append(
        f"summary: {s.gpu_processes} GPU processes, {s.fd_only} fd-only holders, {s.zombies} "
        f"zombies, {s.gone} gone, {s.ghost_gpus} ghost GPUs"
        + (f", {s.d_state} in D state" if s.d_state else "")
        + (f", {s.stale} stale, {s.foreign} foreign" if s.stale or s.foreign else "")
        + (f", {s.dirty_unknown} not judged stale" if s.dirty_unknown else "")
        + (f", {s.unverified} unreadable" if s.unverified else "")
        + f" -> {verdict}"
    )
    return "\n".join(out)
