"""The trace report as the seed's table, plus one accounting line per GPU."""

from __future__ import annotations

from gpuzombie.trace.report import TraceReport, TraceRow

COLUMNS = ("PID", "NSPID", "STATE", "GPU", "GPU_MEM", "NSMI", "QOS", "POD", "NAMESPACE", "CONTAINER")


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} MiB"


def _gpu(row: TraceRow) -> str:
    if row.gpu_index is not None:
        return str(row.gpu_index)
    nodes = [d.removeprefix("/dev/nvidia") for d in row.devices if d.removeprefix("/dev/nvidia").isdigit()]
    return ",".join(nodes) or "-"


def _cells(row: TraceRow) -> tuple[str, ...]:
    # Without names, ids: a pod UID and a short container id still let a person find them.
    pod = row.pod or row.pod_uid or "-"
    container = row.container or (row.container_id[:13] if row.container_id else None)
    if container is None:
        container = "(host)" if row.pod_uid is None and row.state != "-" else "-"
    return (
        "-" if row.pid is None else str(row.pid),
        "-" if row.nspid is None else str(row.nspid),
        row.state,
        _gpu(row),
        _mib(row.gpu_memory_mib),
        "Y" if row.nsmi else "N",
        row.qos or "-",
        pod,
        row.namespace or "-",
        container,
    )


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def render_text(report: TraceReport) -> str:
    out = []
    if report.rows:
        out.append(table([COLUMNS, *(_cells(r) for r in report.rows)]))
    else:
        out.append("no GPU process, /dev/nvidia* holder or zombie on this node")
    if report.gpu.available:
        out.append("")
        for g in report.gpus:
            mark = {"ok": "ok", "ghost": "GHOST", "cannot_tell": "cannot tell"}.get(g.verdict, g.verdict)
            out.append(
                f"GPU {g.index} {g.name} ({g.uuid}): used {_mib(g.used_mib)} = baseline "
                f"{_mib(g.baseline_mib)} + processes {_mib(g.process_memory_mib)} + unexplained "
                f"{_mib(g.unexplained_mib)}  [{mark}]"
            )
            for cause in g.likely_causes:
                out.append(f"  likely cause: {cause}")
            if g.allocated_to and not g.likely_causes:
                out.append(
                    "  allocated to: " + ", ".join(f"{a.namespace}/{a.pod}/{a.container}" for a in g.allocated_to)
                )
        out.append(f"note: {report.baseline_note}")
    for w in report.warnings:
        out.append(f"warning: {w}")
    s = report.summary
    out.append(
        f"summary: {s.gpu_processes} GPU processes, {s.fd_only} fd-only holders, {s.zombies} "
        f"zombies, {s.gone} gone, {s.ghost_gpus} ghost GPUs -> " + ("healthy" if s.healthy else "findings")
    )
    return "\n".join(out)
