"""``run_prestop``: plan from one snapshot, then stop the targets; the report is data."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.nvml import NO_GPU, NvmlBackend
from gpuzombie.prestop.targets import Excluded, PrestopPlan, own_pid_in, plan_targets
from gpuzombie.prestop.terminate import Outcome, PrestopEvent, TargetResult, execute_plan
from gpuzombie.proc.procfs import Procfs

SCHEMA = "gpuzombie.prestop/1"
DEFAULT_TIMEOUT = 20.0
"""The seed's prestop.sh waited 20 s. Timeout + kill wait must fit the pod's grace period."""
DEFAULT_KILL_WAIT = 2.0


@dataclass(frozen=True)
class PrestopReport:
    schema: str
    started_at: float
    duration_s: float
    dry_run: bool
    timeout_s: float
    kill_wait_s: float
    own_pid: int
    pidns: int | None
    in_root_pidns: bool
    pid1_command: str | None
    orphans_included: bool
    gpu_available: bool
    gpu_reason: str | None
    results: tuple[TargetResult, ...]
    excluded: tuple[Excluded, ...]
    survivors: int
    exit_status: int


def plan_prestop(
    *,
    procfs: Procfs,
    nvml: NvmlBackend | None = None,
    include_orphans: bool = True,
    same_cgroup: bool = False,
    own_pid: int | None = None,
) -> PrestopPlan:
    """One snapshot of the namespace and NVML, turned into targets and exclusions."""
    me = own_pid if own_pid is not None else own_pid_in(procfs.root)
    table = procfs.snapshot(now=time.time())
    gpus = nvml.read() if nvml is not None else NO_GPU
    return plan_targets(table, gpus, own_pid=me, include_orphans=include_orphans, same_cgroup=same_cgroup)


def run_prestop(
    *,
    procfs: Procfs | None = None,
    nvml: NvmlBackend | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    kill_wait: float = DEFAULT_KILL_WAIT,
    dry_run: bool = False,
    include_orphans: bool = True,
    same_cgroup: bool = False,
    on_event: Callable[[PrestopEvent], None] = lambda e: None,
    clock: Callable[[], float] = time.monotonic,
) -> PrestopReport:
    """SIGTERM every GPU holder and orphan of this PID namespace, wait ``timeout``, SIGKILL the rest.

    Must run inside the pod's PID namespace with that namespace's procfs (a preStop exec hook
    does). NVML is read once for the plan; the re-scans while waiting use /proc only.
    """
    procfs = procfs or Procfs()
    me = own_pid_in(procfs.root)
    if me != os.getpid():
        raise GpuzombieError(
            f"{procfs.root} is not this PID namespace's procfs ({procfs.root}/self is {me}, we are "
            f"{os.getpid()}): run prestop inside the pod (nsenter needs --pid AND --mount)",
            ExitStatus.ERROR,
        )
    started = time.time()
    t0 = clock()
    plan = plan_prestop(procfs=procfs, nvml=nvml, include_orphans=include_orphans, same_cgroup=same_cgroup, own_pid=me)
    on_event(PrestopEvent(0.0, "plan", None, _plan_line(plan)))
    for ex in plan.excluded:
        on_event(PrestopEvent(0.0, "exclude", ex.pid, f"leaving pid {ex.pid} ({ex.comm}) alone: {ex.reason}"))

    def rescan() -> PrestopPlan:
        return plan_prestop(
            procfs=procfs, nvml=None, include_orphans=include_orphans, same_cgroup=same_cgroup, own_pid=plan.own_pid
        )

    results = execute_plan(
        plan,
        procfs_root=procfs.root,
        timeout=timeout,
        kill_wait=kill_wait,
        dry_run=dry_run,
        rescan=rescan,
        on_event=on_event,
        clock=clock,
    )
    survivors = sum(r.outcome in (Outcome.SURVIVED, Outcome.DENIED) for r in results)
    status = ExitStatus.FINDINGS if survivors else ExitStatus.OK
    report = PrestopReport(
        schema=SCHEMA,
        started_at=started,
        duration_s=round(clock() - t0, 3),
        dry_run=dry_run,
        timeout_s=timeout,
        kill_wait_s=kill_wait,
        own_pid=plan.own_pid,
        pidns=plan.own_pidns,
        in_root_pidns=plan.in_root_pidns,
        pid1_command=plan.pid1_command,
        orphans_included=plan.orphans_included,
        gpu_available=plan.gpu_available,
        gpu_reason=plan.gpu_reason,
        results=results,
        excluded=plan.excluded,
        survivors=survivors,
        exit_status=int(status),
    )
    on_event(PrestopEvent(report.duration_s, "done", None, summary_line(report)))
    return report


def _plan_line(plan: PrestopPlan) -> str:
    gpu = "NVML available" if plan.gpu_available else f"NVML not used ({plan.gpu_reason})"
    orphans = (
        "orphans included"
        if plan.orphans_included
        else ("orphans not swept, own cgroup only (host PID namespace)" if plan.in_root_pidns else "orphans not swept")
    )
    return (
        f"{len(plan.targets)} target(s) in pid namespace {plan.own_pidns} "
        f"(PID 1: {plan.pid1_command}); {orphans}; {gpu}"
    )


def summary_line(report: PrestopReport) -> str:
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no targets"
    verdict = "DRY RUN" if report.dry_run else ("OK" if not report.survivors else f"{report.survivors} SURVIVED")
    return f"{verdict}: {parts} in {report.duration_s:.2f} s"


def render_text(report: PrestopReport) -> str:
    """The table a person reads after the run (the live log has the events)."""
    lines = [f"{'PID':>7}  {'COMM':<16} {'OUTCOME':<28} {'SIGNALS':<26} {'GONE_AFTER':>10}  REASONS"]
    for r in report.results:
        gone = f"{r.exited_after_s:.3f}s" if r.exited_after_s is not None else "-"
        lines.append(
            f"{r.target.pid:>7}  {r.target.comm[:16]:<16} {r.outcome.value:<28} "
            f"{','.join(r.signals) or '-':<26} {gone:>10}  {'; '.join(r.target.reasons)}"
        )
    for ex in report.excluded:
        lines.append(f"{ex.pid:>7}  {ex.comm[:16]:<16} {'untouched':<28} {'-':<26} {'-':>10}  {ex.reason}")
    lines.append(summary_line(report))
    return "\n".join(lines)
