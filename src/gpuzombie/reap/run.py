"""``run_reap``: end the processes of stale pods with prestop's termination; the report is data.

The same pidfd-only, pid-reuse-safe sequence as the preStop hook (``prestop.terminate.Terminator``):
every process is pinned by a pidfd before it is read, signalled only through it, SIGTERM,
``timeout``, SIGKILL, ``kill_wait``. While it waits it re-scans the stale pods' cgroups (a child forked or
re-parented meanwhile is ended too), each re-scan asking the runtime again: a pod that runs again
gets no new target. A process in state D cannot die until the driver lets it go: it is reported as
not killable once ``kill_wait`` has passed, never waited for beyond that.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.attribution import current_view
from gpuzombie.gpu.nvml import NO_GPU, NvmlBackend, read_gpus
from gpuzombie.k8s.liveness import PodState
from gpuzombie.k8s.owner import NamesLookup
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.prestop.targets import Target, Untargeted
from gpuzombie.prestop.terminate import (
    Outcome,
    PrestopEvent,
    TargetResult,
    TerminationRun,
    Terminator,
    count_left_alive,
)
from gpuzombie.proc.pidfd import PinnedPids, read_start_and_state
from gpuzombie.proc.pidns import is_root_pidns, own_pid_in, reader_pidns
from gpuzombie.proc.procfs import Procfs
from gpuzombie.reap.plan import ReapPlan, StalePod, stale_pods, stale_targets
from gpuzombie.trace.model import PodsLookup, build_trace
from gpuzombie.units import MIB

SCHEMA = "gpuzombie.reap/1"
REAP_TIMEOUT = 10.0
DEFAULT_KILL_WAIT = 2.0
STOPPED_STATES = (PodState.NOT_READY, PodState.NOT_LISTED)


@dataclass(frozen=True)
class ReapResult(TargetResult):
    """The terminator's result, with ``not_killable_d_state`` for a survivor in state D."""

    state_after: str | None = None
    """The process's state when the run ended (None: gone)."""


@dataclass(frozen=True)
class ReapReport(TerminationRun):
    runtime: str | None
    """The CRI socket whose answer made the pods stale."""
    stale_pods: tuple[StalePod, ...]
    skipped_pods: tuple[str, ...]
    """Stale pods left alone because ``--pod-uid`` did not name them."""
    results: tuple[ReapResult, ...]
    unread: tuple[Untargeted, ...]
    survivors: int
    """Targets left alive (not killable in D, signal refused, no pidfd)."""
    exit_status: int


def plan_reap(
    *,
    procfs: Procfs,
    pods: PodsLookup,
    names: NamesLookup,
    nvml: NvmlBackend | None,
    only: frozenset[str] | None,
    own_pid: int,
) -> tuple[ReapPlan, PinnedPids, str | None]:
    """Pin, read the node, trace it (the runtime asked after the read) and pick the stale pods'
    processes. Raises GpuzombieError (exit 2) when the runtime could not tell stale from unknown."""
    pids = procfs.pids()
    pins = PinnedPids(pids)
    try:
        table = procfs.snapshot(pids, now=time.time())
        gpus = read_gpus(nvml) if nvml is not None else NO_GPU
        report, _ = build_trace(
            table,
            gpus,
            view=current_view(),
            names=names,
            resources=PodResources(source=None),
            now=table.taken_at,
            pods=pods,
        )
        if report.checks.stale_problem is not None:
            raise GpuzombieError(
                f"refusing to reap: the runtime cannot tell a stale pod from an unknown one: "
                f"{report.checks.stale_problem}",
                ExitStatus.ERROR,
            )
        found, skipped = stale_pods(report, only)
        memory: dict[int, int] = {}
        for row in report.rows:
            if row.pid is not None and row.gpu_memory:
                memory[row.pid] = memory.get(row.pid, 0) + row.gpu_memory
        targets, unread = stale_targets(table, found, own_pid=own_pid, memory=memory)
    except BaseException:
        pins.close()
        raise
    plan = ReapPlan(stale_pods=tuple(found), targets=tuple(targets), unread=tuple(unread), skipped_pods=tuple(skipped))
    return plan, pins, report.sources.cri_socket


def reaping_pid(procfs: Procfs) -> int:
    """This process's pid, once ``procfs`` is the mounted procfs of its own PID namespace and that is
    the host's; else GpuzombieError (exit 2): pids read from any other tree are not the node's."""
    me = own_pid_in(procfs.root)
    if me != os.getpid():
        raise GpuzombieError(
            f"{procfs.root} is not this PID namespace's procfs ({procfs.root}/self is {me}, we are {os.getpid()})",
            ExitStatus.ERROR,
        )
    if not is_root_pidns(reader_pidns(procfs.root)):
        raise GpuzombieError(
            "reap runs in the host's PID namespace (a node shell or a hostPID pod): stale pods' processes "
            "are not visible from here",
            ExitStatus.ERROR,
        )
    return me


def run_reap(
    *,
    procfs: Procfs | None = None,
    pods: PodsLookup,
    names: NamesLookup,
    nvml: NvmlBackend | None = None,
    only: frozenset[str] | None = None,
    timeout: float = REAP_TIMEOUT,
    kill_wait: float = DEFAULT_KILL_WAIT,
    dry_run: bool = True,
    on_event: Callable[[PrestopEvent], None] = lambda e: None,
    clock: Callable[[], float] = time.monotonic,
) -> ReapReport:
    """End every process of every stale pod (``only``: of those pods), or with ``dry_run`` list them.

    Must run in the host's PID namespace with its own procfs (a node shell, a hostPID pod), and
    with a runtime that answers: else GpuzombieError (exit 2) before anything is read or signalled."""
    procfs = procfs or Procfs()
    me = reaping_pid(procfs)
    first = pods()
    if first.problem is not None:
        raise GpuzombieError(f"refusing to reap: no pod can be told stale: {first.problem}", ExitStatus.ERROR)
    started, t0 = time.time(), clock()
    plan, pins, source = plan_reap(procfs=procfs, pods=pods, names=names, nvml=nvml, only=only, own_pid=me)
    for pod in plan.stale_pods:
        where = f"{pod.namespace}/{pod.pod}" if pod.pod else pod.pod_uid
        on_event(PrestopEvent(0.0, "stale", None, f"stale pod {where}: {pod.reason}"))
    for target in plan.targets:
        if target.state == "D":
            on_event(
                PrestopEvent(
                    0.0,
                    "dstate",
                    target.pid,
                    f"pid {target.pid} ({target.comm}) is in state D: signals wait until the driver lets "
                    f"it go; reported as not killable after --kill-wait, never waited for longer",
                )
            )
    uids = {p.pod_uid for p in plan.stale_pods}

    def rescan() -> tuple[list[Target], PinnedPids]:
        pids = procfs.pids()
        new_pins = PinnedPids(pids)
        try:
            table = procfs.snapshot(pids, now=time.time())
            now = pods()
            still = [p for p in plan.stale_pods if now.problem is None and now.state(p.pod_uid) in STOPPED_STATES]
            targets, _ = stale_targets(table, still, own_pid=me)
        except BaseException:
            new_pins.close()
            raise
        return targets, new_pins

    terminator = Terminator(
        procfs_root=procfs.root, rescan=rescan if uids else None, dry_run=dry_run, on_event=on_event, clock=clock
    )
    reaped = []
    for r in terminator.run(plan.targets, pins, timeout=timeout, kill_wait=kill_wait):
        now_state = read_start_and_state(procfs.root, r.target.pid)
        state = now_state[1] if now_state is not None and now_state[0] == r.target.start_ticks else None
        outcome = Outcome.NOT_KILLABLE if r.outcome is Outcome.SURVIVED and state == "D" else r.outcome
        reaped.append(ReapResult(r.target, outcome, r.signals, r.exited_after_s, r.found_by_rescan, state))
    survivors = count_left_alive(r.outcome for r in reaped)
    findings = bool(plan.targets) if dry_run else bool(survivors)
    status = ExitStatus.FINDINGS if findings or plan.unread else ExitStatus.OK
    return ReapReport.of_run(
        SCHEMA,
        started,
        clock() - t0,
        dry_run=dry_run,
        timeout=timeout,
        kill_wait=kill_wait,
        runtime=source,
        stale_pods=plan.stale_pods,
        skipped_pods=plan.skipped_pods,
        results=tuple(reaped),
        unread=plan.unread,
        survivors=survivors,
        exit_status=int(status),
    )


def render_text(report: ReapReport) -> str:
    """One line a stale pod, one a process (what it controls escaped), and the verdict."""
    lines = []
    for pod in report.stale_pods:
        where = f"{pod.namespace}/{pod.pod} ({pod.pod_uid})" if pod.pod else pod.pod_uid
        memory = f", {pod.gpu_memory / MIB:.0f} MiB" if pod.gpu_memory else ""
        lines.append(f"stale pod {escape(where)}: {len(pod.holders)} GPU holder(s){memory}; {escape(pod.reason)}")
    for uid in report.skipped_pods:
        lines.append(f"stale pod {uid}: left alone (not named by --pod-uid)")
    if report.results:
        lines.append(f"{'PID':>7}  {'STATE':<5} {'COMM':<16} {'OUTCOME':<28} {'SIGNALS':<26} {'GONE_AFTER':>10}")
    for r in report.results:
        gone = f"{r.exited_after_s:.3f}s" if r.exited_after_s is not None else "-"
        lines.append(
            f"{r.target.pid:>7}  {r.target.state:<5} {escape(r.target.comm, 16):<16} {r.outcome.value:<28} "
            f"{','.join(r.signals) or '-':<26} {gone:>10}"
        )
    for u in report.unread:
        lines.append(f"{u.pid:>7}  {'?':<5} {escape(u.comm, 16):<16} {'unread (untouched)':<28} {escape(u.reason)}")
    lines.append(summary_line(report))
    return "\n".join(lines)


def summary_line(report: ReapReport) -> str:
    pods = f"{len(report.stale_pods)} stale pod(s), {len(report.results)} process(es)"
    if not report.stale_pods:
        verdict = "nothing to reap: no stale pod"
    elif report.dry_run:
        verdict = f"DRY RUN: {pods} would be ended (run with --yes)"
    elif report.survivors:
        verdict = f"{report.survivors} SURVIVED of {pods}"
    else:
        verdict = f"OK: {pods} ended"
    unread = f"; {len(report.unread)} unreadable process(es) left alone" if report.unread else ""
    return f"{verdict}{unread} in {report.duration_s:.2f} s"
