"""One frame of ``gpuzombie top`` as rich renderables: what ``--once`` prints and the Textual app's
cells are made of. Every cell is a ``rich.text.Text`` (never markup: a pod named ``[red]x`` stays
that text), made from the model's already escaped strings."""

from __future__ import annotations

import io
from typing import TypedDict, Unpack

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuzombie.escape import escape
from gpuzombie.top.model import HOST, GpuGroup, NodeView, PodLine, ProcessLine
from gpuzombie.trace.model import GpuMemory
from gpuzombie.units import MIB

POD_COLUMNS = ("POD", "GPU MEM", "PROCS", "PID 1", "ZOMB", "ORPH", "D-STATE", "MARK", "GRACE RISK", "RUNTIME", "AGE")
PROCESS_COLUMNS = ("PID", "NSPID", "S", "GPU MEM", "CONTAINER", "COMMAND")
_HANDOVER_STYLE = {"clean": "green", "in use": "cyan", "dirty": "bold red", "cannot tell": "yellow"}


def duration(seconds: float | None) -> str:
    """``42s``, ``7m03s``, ``5h02m``, ``3d04h``; "" for None."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def mib(n: int | None) -> str:
    return "" if n is None else f"{n // MIB:,} MiB"


def header(view: NodeView, *, sort: str, namespace: str, text: str, read_only: bool) -> Text:
    line = Text(f"gpuzombie top  node {view.node or '?'}  ", style="bold")
    line.append(f"NVML {view.nvml}  ")
    line.append(f"{view.pods} pods, {view.processes} processes, scan {view.scan_s * 1000:.0f} ms  ")
    line.append(f"sort {sort}")
    if namespace:
        line.append(f"  namespace {namespace}")
    if text:
        line.append("  filter ")
        line.append(text)
    line.append("  read-only" if read_only else "  ACTIONS ALLOWED", style="" if read_only else "bold red")
    return line


def group_title(group: GpuGroup) -> Text:
    title = Text(group.title, style="bold")
    m = group.memory
    if m is not None:
        title.append(f"  used {mib(m.used)} {accounting(m)}")
    if group.handover:
        title.append(f"  {_handover_label(group)}", style=_HANDOVER_STYLE.get(group.handover, ""))
        title.append(f" ({group.handover_reason})" if group.handover_reason else "")
    return title


GRID_COLUMNS = (*POD_COLUMNS, "DETAIL")
"""The full screen's one table: a group's, a pod's and a process's rows share these columns; what is
long (a GPU's UUID and accounting, a command line) goes last, where it cannot push the rest away."""


def _handover_label(group: GpuGroup) -> str:
    return "clean to hand out" if group.handover == "clean" else group.handover


def accounting(m: GpuMemory) -> str:
    ghost = mib(m.unexplained) if m.flagged else "0 MiB"
    return f"of {mib(m.total)}: driver {mib(m.baseline)}, processes {mib(m.process_memory)}, ghost {ghost}"


def group_row(group: GpuGroup) -> tuple[Text, ...]:
    m = group.memory
    blank = Text("")
    if m is None:
        return (Text(group.title, style="bold"), *(blank,) * (len(GRID_COLUMNS) - 1))
    where = f"GPU {m.index}" + (f" MIG {escape(m.mig.profile, 32)} (GI {m.mig.gpu_instance_id})" if m.mig else "")
    cells = dict.fromkeys(GRID_COLUMNS, blank)
    cells["POD"] = Text(f"{where} {escape(m.name, 40)}", style="bold")
    cells["GPU MEM"] = Text(mib(m.used), style="bold", justify="right")
    cells["MARK"] = Text(group.handover.upper(), style=_HANDOVER_STYLE.get(group.handover, ""))
    cells["DETAIL"] = Text(f"{m.uuid}  {accounting(m)}  handover: {_handover_label(group)} ({group.handover_reason})")
    return tuple(cells.values())


def grid_process_row(proc: ProcessLine) -> tuple[Text, ...]:
    cells = dict.fromkeys(GRID_COLUMNS, Text(""))
    pid, _, state, memory, container, command = process_cells(proc)
    cells["POD"] = Text("  ") + pid + Text(f" ({proc.nspid}) ") + state
    cells["GPU MEM"] = memory
    cells["PID 1"] = container
    cells["AGE"] = Text(duration(proc.age_s), justify="right")
    cells["DETAIL"] = command
    return tuple(cells.values())


def pod_cells(pod: PodLine) -> tuple[Text, ...]:
    name = pod.label if pod.key != HOST else "(host processes)"
    if pod.containers:
        name += " [" + ",".join(pod.containers) + "]"
    d_state = f"{pod.d_state} for {duration(pod.d_state_max_s)}" if pod.d_state else ""
    runtime = pod.runtime_state
    if pod.stopping_s is not None:
        runtime += f" {duration(pod.stopping_s)}"
    reaps = "" if pod.reaps is None else "" if pod.reaps else " NO REAP"
    return (
        Text(name),
        Text(mib(pod.gpu_memory) if pod.gpu_memory else "", justify="right"),
        Text(str(len(pod.processes)), justify="right"),
        Text(pod.pid1 + reaps, style="" if pod.reaps is not False else "yellow"),
        Text(str(pod.zombies) if pod.zombies else "", style="red", justify="right"),
        Text(str(pod.orphans) if pod.orphans else "", style="yellow", justify="right"),
        Text(d_state, style="red"),
        Text((pod.dirty or "").upper(), style="bold red"),
        Text(pod.grace_risk or "", style="yellow"),
        Text(runtime, style="" if runtime in ("running", "") else "red"),
        Text(duration(pod.age_s), justify="right"),
    )


def process_cells(proc: ProcessLine) -> tuple[Text, ...]:
    state = proc.state + (f" {duration(proc.d_state_s)}" if proc.d_state_s is not None else "")
    command = Text("  " * proc.depth + ("└ " if proc.depth else ""))
    command.append(proc.command)
    if proc.dirty:
        command.append(f"  {proc.dirty.upper()}", style="bold red")
    return (
        Text(str(proc.pid), justify="right"),
        Text(str(proc.nspid), justify="right"),
        Text(state, style="red" if proc.state in ("Z", "D") else ""),
        Text(mib(proc.gpu_memory) if proc.gpu_memory else "", justify="right"),
        Text(proc.container),
        command,
    )


_MAX_WIDTH = {"POD": 60, "PID 1": 48, "GRACE RISK": 40}


def _pod_table(widths: list[int], *, show_header: bool = True) -> Table:
    """One group's pods; ``widths`` shared by every piece of the group, so the columns line up
    around the process tables between them."""
    table = Table(box=None, pad_edge=False, show_edge=False, show_header=show_header)
    for column, width in zip(POD_COLUMNS, widths):
        table.add_column(column, no_wrap=True, overflow="ellipsis", width=width)
    return table


def _widths(rows: list[tuple[Text, ...]]) -> list[int]:
    return [
        min(_MAX_WIDTH.get(column, 1000), max([len(column), *(r[i].cell_len for r in rows)]))
        for i, column in enumerate(POD_COLUMNS)
    ]


def process_table(processes: tuple[ProcessLine, ...]) -> Table:
    """A pod's processes, indented below it."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="dim")
    table.add_column("", width=2)
    for column in PROCESS_COLUMNS:
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for proc in processes:
        table.add_row(Text(""), *process_cells(proc))
    return table


def frame(
    view: NodeView,
    *,
    sort: str = "memory",
    namespace: str = "",
    text: str = "",
    read_only: bool = True,
    expanded: frozenset[str] | None = None,
) -> RenderableType:
    """The whole frame: header, warnings, one table per group, a pod's processes below it when
    ``expanded`` names it (None: every pod expanded, as ``--once --tree`` prints)."""
    parts: list[RenderableType] = [header(view, sort=sort, namespace=namespace, text=text, read_only=read_only)]
    parts.extend(Text(f"warning: {w}", style="yellow") for w in view.warnings)
    for group in view.groups:
        parts.append(Text(""))
        parts.append(group_title(group))
        if not group.pods:
            parts.append(Text("  no pod holds it"))
            continue
        rows = [pod_cells(pod) for pod in group.pods]
        widths = _widths(rows)
        table = _pod_table(widths)
        for pod, cells in zip(group.pods, rows):
            table.add_row(*cells)
            if expanded is None or pod.key in expanded:
                parts.extend((table, process_table(pod.processes)))
                table = _pod_table(widths, show_header=False)
        if table.row_count:
            parts.append(table)
    return Group(*parts)


class FrameOptions(TypedDict, total=False):
    """``frame``'s options, which ``render_text`` passes on."""

    sort: str
    namespace: str
    text: str
    read_only: bool
    expanded: frozenset[str] | None


def render_text(view: NodeView, *, width: int = 160, **how: Unpack[FrameOptions]) -> str:
    """The frame (``how``: ``frame``'s options) as plain text ``width`` columns wide: ``--once``'s
    output, no colour, no escapes."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(frame(view, **how))
    return out.getvalue()
