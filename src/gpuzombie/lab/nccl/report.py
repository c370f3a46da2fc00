"""The NCCL comparison as files: results.json (summary + every sample), comparison.md, memory.png."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuzombie.jsonout import dumps
from gpuzombie.lab.nccl.sampling import MemorySample
from gpuzombie.lab.nccl.summary import NcclSummary

if TYPE_CHECKING:  # rich is imported only when a table is made
    from rich.table import Table


def _seconds_cell(value: float | None, still: float | None = None) -> str:
    """A time after the kill, or how long a survivor was still running when the window closed."""
    if value is not None:
        return f"{value:.2f}"
    return f"still running at {still:.0f} s" if still is not None else "-"


def comparison_rows(summary: NcclSummary) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """The columns (markdown header, short terminal header) and one row of cells per case: what
    each survivor did after rank 0 was SIGKILLed."""
    mem = "GPU memory free" if not summary.stand_in else "memory (RSS) free"
    columns = [
        ("case", "case"),
        ("setting", "setting"),
        ("survivor exit (s after kill)", "exit (s)"),
        (f"{mem} (s)", "free (s)"),
        ("exit code", "code"),
        ("ghost on dead rank's GPU (MiB)", "ghost MiB"),
        (f"≤ {summary.goal_s:g} s", f"≤ {summary.goal_s:g} s"),
    ]
    rows = []
    for c in summary.cases:
        name = f"{c.case} {c.name}"
        if c.error:
            rows.append([name, c.description, f"failed: {c.error}", "", "", "", ""])
            continue
        sv = c.survivors
        rows.append(
            [
                name,
                c.description,
                ", ".join(_seconds_cell(s.exit_s, s.still_running_at_s) for s in sv),
                ", ".join(_seconds_cell(s.memory_free_s, s.still_running_at_s) for s in sv),
                ", ".join("-" if s.exit_code is None else str(s.exit_code) for s in sv),
                "-" if c.ghost_mib is None else f"{c.ghost_mib:.0f}",
                "yes" if c.goal_met else "no",
            ]
        )
    return columns, rows


def comparison_heading(summary: NcclSummary) -> str:
    return f"NCCL scenario: {summary.ranks} ranks, {summary.backend}, rank 0 SIGKILLed mid-collective" + (
        f" — {summary.label}" if summary.stand_in else ""
    )


def gpu_end_line(summary: NcclSummary) -> str | None:
    """Each GPU's used and unexplained memory when the window closed (None without GPUs)."""
    if not summary.gpu_end:
        return None
    return "GPU memory at the end of the window: " + "; ".join(
        f"GPU{g.index} used {g.used_mib:.0f} MiB, unexplained {g.unexplained_mib:.0f} MiB" for g in summary.gpu_end
    )


def comparison_table(summary: NcclSummary) -> str:
    """The comparison as markdown, for comparison.md."""
    columns, rows = comparison_rows(summary)
    headers = [markdown for markdown, _ in columns]
    lines = [comparison_heading(summary), "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if (end := gpu_end_line(summary)) is not None:
        lines += ["", end]
    return "\n".join(lines) + "\n"


def terminal_table(summary: NcclSummary) -> Table:
    """The comparison as a rich table for the terminal; the CLI prints it (nothing below cli/ does)."""
    from rich.table import Table

    columns, rows = comparison_rows(summary)
    mem = "GPU memory" if not summary.stand_in else "memory (RSS)"
    caption = f"exit, free: s after rank 0's SIGKILL; free: the survivor's {mem} released; ghost: unlisted memory on the dead rank's GPU"
    end = gpu_end_line(summary)
    table = Table(title=comparison_heading(summary), caption=caption + (f"\n{end}" if end else ""))
    for _, short in columns:
        table.add_column(short, no_wrap=short != "setting", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def write_results(nccl_dir: Path, summary: NcclSummary, samples: list[MemorySample]) -> None:
    nccl_dir.mkdir(parents=True, exist_ok=True)
    (nccl_dir / "results.json").write_text(dumps({**summary.to_json(), "samples": samples}, indent=1))
    (nccl_dir / "comparison.md").write_text(summary.table_md)
    try:
        plot(nccl_dir / "memory.png", summary, samples)
    except ImportError:
        pass  # matplotlib is the optional "plot" extra


def plot(path: Path, summary: NcclSummary, samples: list[MemorySample]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if any(s.gpus for s in samples) else 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 4 * rows), squeeze=False)
    ax = axes[0][0]
    ts = [s.t for s in samples]
    for c in summary.cases:
        for sv in c.survivors:
            ys = [s.by_pid.get(sv.pid, 0.0) for s in samples]
            ax.plot(ts, ys, label=f"{c.case} {c.name} rank {sv.rank}")
        if c.killed_at_s is not None:
            ax.axvline(c.killed_at_s, linestyle=":", linewidth=0.8, color="grey")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB held by survivor" + (" (RSS)" if summary.stand_in else " (NVML)"))
    ax.set_title(comparison_title(summary))
    ax.legend(fontsize=7)
    if rows == 2:
        ax2 = axes[1][0]
        indices = sorted({g.index for s in samples for g in s.gpus})
        for i in indices:
            pts = [(s.t, g) for s in samples for g in s.gpus if g.index == i]
            ax2.plot([t for t, _ in pts], [g.used_mib for _, g in pts], label=f"GPU{i} used")
            ax2.plot(
                [t for t, _ in pts],
                [g.unexplained_mib for _, g in pts],
                linestyle="--",
                label=f"GPU{i} unexplained (ghost)",
            )
        ax2.set_xlabel("seconds")
        ax2.set_ylabel("MiB")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def comparison_title(summary: NcclSummary) -> str:
    kind = "CPU stand-in (gloo)" if summary.stand_in else "NCCL"
    return f"{kind}: {summary.ranks} ranks, rank 0 SIGKILLed (dotted lines)"
