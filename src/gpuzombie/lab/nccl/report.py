"""The NCCL comparison as files: results.json (summary + every sample), comparison.md, memory.png."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuzombie.lab.nccl.sampling import MemorySample


def _seconds_cell(value: float | None, still: float | None = None) -> str:
    """A time after the kill, or how long a survivor was still running when the window closed."""
    if value is not None:
        return f"{value:.2f}"
    return f"still running at {still:.0f} s" if still is not None else "-"


def comparison_table(summary: dict[str, Any]) -> str:
    """One row per case: what each survivor did after rank 0 was SIGKILLed."""
    mem = "GPU memory free" if not summary["stand_in"] else "memory (RSS) free"
    lines = [
        f"NCCL scenario: {summary['ranks']} ranks, {summary['backend']}, rank 0 SIGKILLed mid-collective"
        + (f" — {summary['label']}" if summary["stand_in"] else ""),
        "",
        f"| case | setting | survivor exit (s after kill) | {mem} (s) | exit code | ghost on dead rank's GPU (MiB) | ≤ {summary['goal_s']:g} s |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in summary["cases"]:
        if c["error"]:
            lines.append(f"| {c['case']} {c['name']} | {c['description']} | failed: {c['error']} | | | | |")
            continue
        sv = c["survivors"]
        exits = ", ".join(_seconds_cell(s["exit_s"], s["still_running_at_s"]) for s in sv)
        frees = ", ".join(_seconds_cell(s["memory_free_s"], s["still_running_at_s"]) for s in sv)
        codes = ", ".join("-" if s["exit_code"] is None else str(s["exit_code"]) for s in sv)
        ghost = "-" if c["ghost_mib"] is None else f"{c['ghost_mib']:.0f}"
        lines.append(
            f"| {c['case']} {c['name']} | {c['description']} | {exits} | {frees} | {codes} | "
            f"{ghost} | {'yes' if c['goal_met'] else 'no'} |"
        )
    if summary.get("gpu_end"):
        lines.append("")
        lines.append(
            "GPU memory at the end of the window: "
            + "; ".join(
                f"GPU{g['index']} used {g['used_mib']:.0f} MiB, unexplained {g['unexplained_mib']:.0f} MiB"
                for g in summary["gpu_end"]
            )
        )
    return "\n".join(lines) + "\n"


def write_results(nccl_dir: Path, summary: dict[str, Any], samples: list[MemorySample]) -> None:
    nccl_dir.mkdir(parents=True, exist_ok=True)
    data = {**summary, "samples": [asdict(s) for s in samples]}
    (nccl_dir / "results.json").write_text(json.dumps(data, indent=1, default=str))
    (nccl_dir / "comparison.md").write_text(summary["table_md"])
    try:
        plot(nccl_dir / "memory.png", summary, samples)
    except ImportError:
        pass  # matplotlib is the optional "plot" extra


def plot(path: Path, summary: dict[str, Any], samples: list[MemorySample]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if any(s.gpus for s in samples) else 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 4 * rows), squeeze=False)
    ax = axes[0][0]
    ts = [s.t for s in samples]
    for c in summary["cases"]:
        for sv in c["survivors"]:
            ys = [s.by_pid.get(sv["pid"], 0.0) for s in samples]
            ax.plot(ts, ys, label=f"{c['case']} {c['name']} rank {sv['rank']}")
        if c["killed_at_s"] is not None:
            ax.axvline(c["killed_at_s"], linestyle=":", linewidth=0.8, color="grey")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB held by survivor" + (" (RSS)" if summary["stand_in"] else " (NVML)"))
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


def comparison_title(summary: dict[str, Any]) -> str:
    kind = "CPU stand-in (gloo)" if summary["stand_in"] else "NCCL"
    return f"{kind}: {summary['ranks']} ranks, rank 0 SIGKILLed (dotted lines)"
