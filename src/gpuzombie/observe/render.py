"""The readable form of an ObserveReport: the original experiment's eight observe.sh sections, as plain text.

Plain text (no rich) so the report reads the same in a terminal, a ``kubectl exec`` log and a
results/ file.
"""

from __future__ import annotations

from gpuzombie.escape import escape
from gpuzombie.gpu.nvml import MigInstance
from gpuzombie.observe.model import ObserveReport
from gpuzombie.observe.orphans import ORPHAN
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable
from gpuzombie.units import MIB


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.0f} MiB"


def _gpu(index: int, mig: MigInstance | None) -> str:
    """A GPU, or one of its MIG GPU instances: ``0`` or ``0/GI1``."""
    return f"{index}/GI{mig.gpu_instance_id}" if mig else str(index)


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    cells = [header] + [tuple("-" if c is None else escape(str(c), 300) for c in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in cells]


def _tree_rows(table: ProcessTable, now: float, marks: dict[int, str]) -> list[tuple[object, ...]]:
    """Depth-first rows; roots are processes whose parent is not in the tree (PID 1, ppid 0)."""
    rows: list[tuple[object, ...]] = []

    def visit(proc: ProcessInfo, depth: int) -> None:
        children = table.children(proc.pid)
        kernel = proc.pid == 2 and proc.comm == "kthreadd" and not proc.cmdline
        text = escape(proc.command, 100) + (f" + {len(children)} kernel threads" if kernel else "")
        if proc.incomplete:
            text += "  [unread: " + ", ".join(f"{u.file} {u.reason.value}" for u in proc.incomplete) + "]"
        rows.append(
            (
                proc.pid,
                proc.ppid,
                proc.state,
                proc.uid,
                f"{max(0.0, now - proc.start_time):.0f}s",
                "  " * depth + text + marks.get(proc.pid, ""),
            )
        )
        for child in () if kernel else children:
            visit(child, depth + 1)

    for proc in table:
        if proc.ppid not in table.processes or proc.ppid == proc.pid:
            visit(proc, 0)
    return rows


def _section(n: int, title: str) -> list[str]:
    return ["", f"[{n}] {title}"]


def _processes(r: ObserveReport) -> list[str]:
    """Sections 1 to 4: PID 1, the process tree, zombies, orphans."""
    s = r.summary
    out = _section(1, "PID 1")
    out.append(f"  {escape(r.pid1.command or '?', 120)}  ->  {r.pid1.kind.value}: {r.pid1.note}")
    marks = {z.pid: "  <- zombie" for z in r.zombies}
    marks.update({o.pid: f"  <- {'orphan' if o.verdict == ORPHAN else 'orphan? cannot tell'}" for o in r.orphans})
    marks.update({h.pid: "  <- D state, holds the GPU" for h in r.d_state_holders})
    marks.update(dict.fromkeys(r.view.excluded_pids, "  (this observer)"))
    out += _section(2, "Process tree")
    out += _table(("PID", "PPID", "STAT", "UID", "AGE", "COMMAND"), _tree_rows(r.table, r.taken_at, marks))
    out += _section(3, f"Zombies (state Z): {s.zombies}")
    out += _table(
        ("PID", "PPID", "PARENT", "AGE", "REAPED BY"),
        [(z.pid, z.ppid, z.parent_comm, f"{z.age_s:.0f}s", z.reaped_by) for z in r.zombies],
    )
    out += _section(
        4,
        f"Orphans (re-parented to PID 1): {s.orphans}"
        + (f", {len(r.orphans) - s.orphans} cannot tell" if len(r.orphans) > s.orphans else ""),
    )
    out += _table(
        ("PID", "COMM", "AGE", "VERDICT", "EVIDENCE"),
        [(o.pid, o.comm, f"{o.age_s:.0f}s", o.verdict, "; ".join(o.evidence) or "none") for o in r.orphans],
    )
    return out


def _gpus(r: ObserveReport) -> list[str]:
    """Sections 5 to 7: GPU memory, NVML's processes, /dev/nvidia* holders."""
    out = _section(5, "GPU memory")
    if not r.gpu.available:
        out.append(f"  no GPU/NVML: {r.gpu.reason}")
    else:
        out += _table(
            ("GPU", "NAME", "TOTAL", "USED", "RESERVED", "UUID"),
            [
                (
                    _gpu(d.index, d.mig),
                    d.name + (f" MIG {d.mig.profile}" if d.mig else " (MIG mode)" if d.mig_mode else ""),
                    _mib(d.memory_total),
                    _mib(d.memory_used),
                    _mib(d.memory_reserved),
                    d.uuid,
                )
                for d in r.gpu.devices
            ],
        )
    out += _section(6, f"GPU processes (NVML): {r.summary.gpu_processes}")
    out += _table(
        ("GPU", "NVML_PID", "LOCAL_PID", "HOST_PID", "COMM", "MEMORY", "VERDICT", "EVIDENCE"),
        [
            (
                _gpu(g.gpu_index, g.mig),
                g.nvml_pid,
                g.local_pid,
                g.host_pid,
                g.comm,
                _mib(g.used_memory),
                g.verdict.value,
                g.evidence,
            )
            for g in r.attribution.processes
        ],
    )
    out += _section(7, f"/dev/nvidia* holders: {len(r.attribution.fd_holders)}")
    out += _table(
        ("PID", "LOCAL_PID", "STAT", "COMM", "IN_NVML", "DEVICES"),
        [
            (h.pid, h.local_pid, h.state, h.comm, "yes" if h.listed_by_nvml else "NO", " ".join(h.devices))
            for h in r.attribution.fd_holders
        ],
    )
    return out


def _ghosts(r: ObserveReport) -> list[str]:
    """Section 8: orphaned contexts, ghost memory and D-state holders."""
    out = _section(8, "Orphaned contexts and ghost memory")
    for g in r.orphaned_contexts:
        out.append(
            f"  ORPHANED CONTEXT: GPU {g.gpu_index} pid {g.nvml_pid} {_mib(g.used_memory)} "
            f"({g.verdict.value}: {escape(g.evidence, 1000)})"
        )
    if not r.orphaned_contexts:
        out.append("  orphaned contexts: none (no GPU memory attributed to a dead pid)")
    for gh in r.attribution.ghosts:
        line = (
            f"  GPU {_gpu(gh.gpu_index, gh.mig)}: used {_mib(gh.used)} - baseline {_mib(gh.baseline)} "
            f"({gh.baseline_source}) - processes {_mib(gh.process_memory)} = "
            f"{_mib(gh.unexplained)} unexplained -> {gh.verdict.upper()}"
        )
        out.append(line)
        out += [f"      likely: {escape(c, 1000)}" for c in gh.likely_causes]
    for h in r.d_state_holders:
        held = f"{_mib(h.gpu_memory)} on GPU {','.join(map(str, h.gpus))}" if h.gpus else "no memory NVML lists"
        out.append(
            f"  D STATE: pid {h.pid} ({escape(h.comm, 100)}) holds {held}"
            + (f" and {escape(' '.join(h.devices), 300)}" if h.devices else "")
            + ": uninterruptible, SIGKILL waits; if it stays in D only a drain or reboot frees the GPU"
        )
    return out


def render_text(report: ObserveReport) -> str:
    """The eight sections, then a one-line summary; ``view.warnings`` are the caller's (stderr)."""
    r, s = report, report.summary
    out = [
        f"gpuzombie observe — {r.view.procfs}, {r.view.processes_seen} processes, "
        f"{'root' if r.view.in_root_pidns else 'inside a'} PID namespace"
    ]
    out += _processes(r) + _gpus(r) + _ghosts(r)
    verdict = "HEALTHY" if s.healthy else "FINDINGS" if s.findings else "INCOMPLETE (not verified)"
    out += [
        "",
        f"summary: {s.zombies} zombies, {s.orphans} orphans, {s.orphaned_contexts} orphaned "
        f"contexts, {s.ghost_gpus} GPUs with ghost memory"
        + (f", {s.d_state_holders} GPU holders in D state" if s.d_state_holders else "")
        + (f", {s.unverified} unreadable processes" if s.unverified else "")
        + f" -> {verdict}",
    ]
    return "\n".join(out) + "\n"
