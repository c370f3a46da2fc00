"""One observation point of a scenario: the lab's own count from the host, and ``gpuzombie
observe`` run inside the pod (``nsenter``, like ``kubectl exec ... observe.sh`` in the original experiment).

The host-side count does not depend on observe: zombies are the pod's processes in state Z,
orphans its live workers whose parent is the namespace's PID 1 (they were started by the parent,
not by PID 1). Observe's own JSON ``summary`` is recorded beside it, and its log is observe's own
text of that same snapshot (``--text-to-stderr``): observe's renderer is the only one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuzombie.escape import escape
from gpuzombie.gpu.nvml import NvmlBackend
from gpuzombie.lab.runtime.pod import LabPod
from gpuzombie.lab.smi import render_smi
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs

OBSERVE_TIMEOUT_S = 60.0
POD_LINE_LIMIT = 4000
"""Longer than any line observe writes (its cells are cut at 300 characters)."""


@dataclass(frozen=True)
class PodProcess:
    host_pid: int
    pod_pid: int
    ppid: int
    state: str
    role: str
    """pid1, parent, worker, victim (the worker killed with kill -9), or other."""
    rss_bytes: int
    command: str


@dataclass(frozen=True)
class Observation:
    point: str
    t: float
    zombies: int
    orphans: int
    processes: tuple[PodProcess, ...]
    observe_rc: int | None
    observe_summary: Mapping[str, Any] | None
    observe_error: str | None


def python_module(cmdline: tuple[str, ...] | list[str]) -> str | None:
    """``python3 -m <module> ...`` -> module (a shell whose -c string names it does not count)."""
    args = list(cmdline)
    if len(args) >= 3 and args[1] == "-m" and "python" in args[0].rsplit("/", 1)[-1]:
        return args[2]
    return None


def role_of(proc: ProcessInfo, pid1: int, roles: Mapping[int, str]) -> str:
    if proc.pid == pid1:
        return "pid1"
    if proc.pid in roles:
        return roles[proc.pid]
    module = python_module(proc.cmdline)
    if module == "gpuzombie.workloads.parent":
        return "parent"
    if module in ("gpuzombie.workloads.worker", "gpuzombie.workloads.worker_fixed"):
        return "worker"
    return "other"


def pod_table(pod: LabPod) -> ProcessTable:
    return Procfs().snapshot(pids=pod.processes(), now=time.time())


def host_view(pod: LabPod, roles: Mapping[int, str]) -> tuple[PodProcess, ...]:
    table = pod_table(pod)
    return tuple(
        PodProcess(
            host_pid=p.pid,
            pod_pid=p.innermost_pid,
            ppid=p.ppid,
            state=p.state,
            role=role_of(p, pod.pid1, roles),
            rss_bytes=p.rss_bytes,
            command=p.command,
        )
        for p in sorted(table, key=lambda p: p.innermost_pid)
    )


def count(processes: tuple[PodProcess, ...], pid1: int) -> tuple[int, int]:
    """(zombies, orphans) as the original experiment counted them."""
    zombies = sum(1 for p in processes if p.state == "Z")
    orphans = sum(1 for p in processes if p.state != "Z" and p.ppid == pid1 and p.role in ("worker", "victim"))
    return zombies, orphans


def run_observe(pod: LabPod) -> subprocess.CompletedProcess[str]:
    """``gpuzombie observe --json --text-to-stderr`` inside the pod: one snapshot per point, its
    JSON on stdout and observe's own text of the same snapshot on stderr, so the two never disagree."""
    argv = [sys.executable, "-m", "gpuzombie", "observe", "--json", "--text-to-stderr"]
    return pod.exec(argv, timeout=OBSERVE_TIMEOUT_S)


def parse_observe(done: subprocess.CompletedProcess[str]) -> tuple[Mapping[str, Any] | None, str | None, str | None]:
    """(observe's JSON report, its text, None), or (None, None, a one-line reason) when it gave no JSON."""
    try:
        report = json.loads(done.stdout)
        if isinstance(report, dict) and isinstance(report.get("summary"), dict):
            return report, pod_text(done.stderr) or None, None
    except ValueError:
        pass
    last = ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
    return None, None, f"observe gave no JSON summary (exit {done.returncode}): {escape(last, 200)}"


def pod_text(text: str) -> str:
    """The pod's text for a log: observe's own lines unchanged (it escaped what processes control),
    any line that still holds a control character escaped (the pod controls what it prints)."""
    lines = []
    for line in text.rstrip("\n").split("\n"):
        plain = line.replace("\\", "")  # observe's escapes are backslashes: the one safe character escape() rewrites
        lines.append(line if escape(plain, POD_LINE_LIMIT) == plain else escape(line, POD_LINE_LIMIT))
    return "\n".join(lines)


def observe(pod: LabPod, point: str, t: float, roles: Mapping[int, str]) -> tuple[Observation, str]:
    """Take one observation; returns it and the text for ``observe-<point>.log``."""
    processes = host_view(pod, roles) if pod.running else ()
    zombies, orphans = count(processes, pod.pid1)
    rc: int | None = None
    report: Mapping[str, Any] | None = None
    text: str | None = None
    error: str | None = None
    if pod.running:
        done = run_observe(pod)
        rc = done.returncode
        report, text, error = parse_observe(done)
    obs = Observation(
        point=point,
        t=t,
        zombies=zombies,
        orphans=orphans,
        processes=processes,
        observe_rc=rc,
        observe_summary=None if report is None else report["summary"],
        observe_error=error,
    )
    return obs, render_observation(obs, text)


def render_observation(obs: Observation, observe_text: str | None) -> str:
    """The lab's host-side table, then observe's own text as the pod printed it."""
    lines = [
        f"# observation: {obs.point} (t = {obs.t:.3f} s)",
        f"# lab count from the host: zombies={obs.zombies} orphans={obs.orphans}",
        f"{'HOST_PID':>8} {'POD_PID':>7} {'PPID':>7} {'STATE':>5} {'ROLE':<7} COMMAND",
    ]
    lines += [
        f"{p.host_pid:>8} {p.pod_pid:>7} {p.ppid:>7} {p.state:>5} {p.role:<7} {escape(p.command[:100], 100)}"
        for p in obs.processes
    ]
    if not obs.processes:
        lines.append("(the pod has no process)")
    lines += [
        "",
        "# gpuzombie observe, run inside the pod (kubectl exec: nsenter, or ExecSync on a CRI runtime, or kubectl "
        "exec itself on kubernetes)",
    ]
    if obs.observe_error:
        lines.append(f"# {obs.observe_error}")
    lines.append(observe_text or ("(not run: the pod is gone)" if obs.observe_rc is None else "(no report)"))
    return "\n".join(lines) + "\n"


def smi_snapshot(pod: LabPod, nvml: NvmlBackend, title: str, *, standin: bool) -> str:
    """The original experiment's nvidia-smi log of a moment: the GPU's tables and the pod's processes (if running)."""
    table = pod_table(pod) if pod.running else None
    procs = sorted(table, key=lambda p: p.innermost_pid) if table else []
    return render_smi(nvml.read(), procs, title=title, standin=standin)
