"""NVML snapshots rendered like ``nvidia-smi`` (the original experiment saved nvidia-smi output before and after
deleting each pod; we have NVML, so we render the same content from it)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from gpuzombie.gpu.nvml import GpuSnapshot
from gpuzombie.proc.procfs import ProcessInfo
from gpuzombie.units import MIB
from gpuzombie.workloads.memory import CPU_STANDIN_LABEL

WIDTH = 91


def _row(text: str) -> str:
    return f"| {text:<{WIDTH - 4}} |"


def _rule(ch: str = "-") -> str:
    return "+" + ch * (WIDTH - 2) + "+"


def render_smi(gpus: GpuSnapshot, pod_processes: Sequence[ProcessInfo], *, title: str, standin: bool) -> str:
    """nvidia-smi's summary table and ``--query-compute-apps`` list, plus the pod's processes."""
    lines = [f"# {title}", time.strftime("%a %b %d %H:%M:%S %Y")]
    if standin:
        lines.append(f"# {CPU_STANDIN_LABEL}")
    if not gpus.available:
        lines.append(f"No NVIDIA GPU: {gpus.reason}")
    else:
        cuda = gpus.cuda_driver_version
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "N/A"
        lines += [
            _rule(),
            _row(
                f"NVIDIA-SMI (rendered from NVML)   Driver Version: {gpus.driver_version}   CUDA Version: {cuda_text}"
            ),
            _rule("="),
            _row(f"{'GPU':>3}  {'Name':<28} {'Memory-Usage':>24}  {'Reserved':>10}  {'Procs':>5}"),
        ]
        for d in gpus.devices:
            usage = f"{d.memory_used // MIB}MiB / {d.memory_total // MIB}MiB"
            reserved = f"{d.memory_reserved // MIB}MiB" if d.memory_reserved is not None else "N/A"
            lines.append(_row(f"{d.index:>3}  {d.name[:28]:<28} {usage:>24}  {reserved:>10}  {len(d.processes):>5}"))
        lines += [
            _rule(),
            "",
            _rule(),
            _row("Processes:"),
            _row(f"{'GPU':>3}  {'PID':>8}  {'Type':>4}  {'Process name':<40} {'GPU Memory':>12}"),
            _rule("="),
        ]
        procs = [(d.index, p) for d in gpus.devices for p in d.processes]
        for index, p in procs:
            used = f"{p.used_memory // MIB}MiB" if p.used_memory is not None else "N/A"
            kind = "C" if p.kind == "compute" else "G"
            lines.append(_row(f"{index:>3}  {p.pid:>8}  {kind:>4}  {(p.name or '?')[-40:]:<40} {used:>12}"))
        if not procs:
            lines.append(_row("No running processes found"))
        lines += [
            _rule(),
            "",
            "# nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv",
            "index, memory.used [MiB], memory.total [MiB]",
        ]
        lines += [f"{d.index}, {d.memory_used // MIB} MiB, {d.memory_total // MIB} MiB" for d in gpus.devices]
        lines += [
            "",
            "# nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
            "pid, process_name, used_gpu_memory [MiB]",
        ]
        lines += [f"{p.pid}, {p.name or '?'}, {p.used_memory // MIB if p.used_memory else 'N/A'} MiB" for _, p in procs]
    lines += [
        "",
        "# the pod's processes seen from the host (host pid / pid in the pod)",
        f"{'HOST_PID':>8} {'POD_PID':>7} {'PPID':>7} {'STATE':>5} {'RSS_MIB':>8}  COMMAND",
    ]
    for proc in pod_processes:
        lines.append(
            f"{proc.pid:>8} {proc.innermost_pid:>7} {proc.ppid:>7} {proc.state:>5} "
            f"{proc.rss_bytes / MIB:>8.1f}  {proc.command[:100]}"
        )
    if not pod_processes:
        lines.append("(none: the pod has no process left)")
    return "\n".join(lines) + "\n"
