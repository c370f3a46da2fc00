"""``run_prestop``: plan from one snapshot, then stop the targets; the report is data."""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.nvml import NO_GPU, GpuSnapshot, NvmlBackend
from gpuzombie.prestop.options import DEFAULT_KILL_WAIT, PRESTOP_TIMEOUT
from gpuzombie.prestop.scope import Scope
from gpuzombie.prestop.targets import PrestopPlan, Target, Untargeted, plan_targets, require_scope
from gpuzombie.prestop.terminate import PrestopEvent, TargetResult, TerminationRun, Terminator, count_left_alive
from gpuzombie.proc.pidfd import PinnedPids, open_files_limit
from gpuzombie.proc.pidns import own_pid_in, reader_pidns
from gpuzombie.proc.procfs import Procfs

SCHEMA = "gpuzombie.prestop/1"
NVML_NOT_ASKED = GpuSnapshot(available=False, reason="not asked: the /proc fd scan read every process")
"""The fast hook's plan when the fd scan decided alone (every CUDA process holds /dev/nvidia*)."""
REASONS_LIMIT = 400
"""A holder's reasons list its /dev/nvidia* paths (a handful), NVML's memory and orphan evidence."""


@dataclass(frozen=True)
class PrestopReport(TerminationRun):
    plan: PrestopPlan
    """What the run acted on (its targets are ``results`` here)."""
    results: tuple[TargetResult, ...]
    unread: tuple[Untargeted, ...]
    """Processes that could have been targets but could not be read (the plan's, then each
    rescan's): never signalled."""
    incomplete: int
    """How many there were (len(unread)): nonzero means exit 1, not "all gone"."""
    survivors: int
    """Targets left alive: survived SIGKILL, signal refused, or no pidfd to signal through."""
    exit_status: int

    def to_dict(self) -> dict[str, Any]:
        """prestop/1's layout, which consumers read flat: the plan's fields among the run's
        (``own_pidns`` as ``pidns``), its targets left out for the results."""
        run = {f.name: getattr(self, f.name) for f in dataclasses.fields(TerminationRun)}
        plan = {
            ("pidns" if f.name == "own_pidns" else f.name): getattr(self.plan, f.name)
            for f in dataclasses.fields(PrestopPlan)
            if f.name not in ("targets", "excluded", "unread")
        }
        return {
            **run,
            **plan,
            "results": self.results,
            "excluded": self.plan.excluded,
            "unread": self.unread,
            "incomplete": self.incomplete,
            "survivors": self.survivors,
            "exit_status": self.exit_status,
        }


def plan_prestop(
    *,
    procfs: Procfs,
    nvml: NvmlBackend | None = None,
    include_orphans: bool = True,
    same_cgroup: bool = False,
    scope: Scope | None = None,
    own_pid: int | None = None,
    without_nvml: GpuSnapshot = NO_GPU,
) -> tuple[PrestopPlan, PinnedPids]:
    """One snapshot of the namespace and NVML, turned into targets, exclusions and unread processes.

    Every pid that can be a target is pinned by a pidfd *before* it is read, so each target's
    pidfd is the process the plan was made from; pass the pins to ``Terminator.run`` (which closes
    them) or close them. With a scope only the processes its cgroup file puts in it (or that
    cannot be told) are pinned: a node has thousands, and each pidfd is an open file."""
    me = own_pid if own_pid is not None else own_pid_in(procfs.root)
    try:
        pids = procfs.pids()
        pins = PinnedPids(pids if scope is None else [pid for pid in pids if _may_be_in(scope, procfs, pid)])
    except OSError as exc:
        raise _environment_error(exc) from exc
    try:
        table = procfs.snapshot(pids, now=time.time())
        gpus = nvml.read() if nvml is not None else without_nvml
        plan = plan_targets(
            table, gpus, own_pid=me, include_orphans=include_orphans, same_cgroup=same_cgroup, scope=scope
        )
    except OSError as exc:
        pins.close()
        raise _environment_error(exc) from exc
    except BaseException:
        pins.close()
        raise
    return plan, pins


def _may_be_in(scope: Scope, procfs: Procfs, pid: int) -> bool:
    """In the scope by its cgroup file, or cannot be told (gone ones cost nothing: no pidfd opens)."""
    lines = procfs.cgroup(pid)
    return lines is None or scope.contains_cgroup(lines)


def _environment_error(exc: OSError) -> Exception:
    """Out of open files is the environment's limit, said as such (exit 2); any other OSError as it is."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return GpuzombieError(
            f"out of open files ({open_files_limit()}): raise the limit or narrow the scope", ExitStatus.ERROR
        )
    return exc


def _refuse_unpinned(plan: PrestopPlan, pins: PinnedPids) -> None:
    """Before any signal: targets the open-files limit left without a pidfd would never be stopped."""
    short = [t.pid for t in plan.targets if t.pid in pins.unpinned]
    if pins.out_of_fds and short:
        pins.close()
        raise GpuzombieError(
            f"the open-files limit ({open_files_limit()}) is too low to pin the {len(short)} target(s) left "
            f"without a pidfd (one open file each, {len(plan.targets)} in all): raise it (ulimit -n, or the "
            "container's nofile limit) or narrow the scope; nothing was signalled",
            ExitStatus.ERROR,
        )


def _own_pid(procfs: Procfs) -> int:
    """This process's pid, once ``procfs`` is its own PID namespace's procfs (GpuzombieError, exit 2, if not)."""
    me = own_pid_in(procfs.root)
    if me != os.getpid():
        raise GpuzombieError(
            f"{procfs.root} is not this PID namespace's procfs ({procfs.root}/self is {me}, we are "
            f"{os.getpid()}): run prestop inside the pod (nsenter needs --pid AND --mount)",
            ExitStatus.ERROR,
        )
    return me


def _first_plan(
    scan: Callable[..., tuple[PrestopPlan, PinnedPids]],
    nvml: NvmlBackend | None,
    nvml_if_undecided: Callable[[], NvmlBackend] | None,
) -> tuple[PrestopPlan, PinnedPids]:
    """The plan, NVML asked only when the /proc scan left a process unread (``nvml_if_undecided``)."""
    if nvml is None and nvml_if_undecided is not None:
        plan, pins = scan(nvml=None, without_nvml=NVML_NOT_ASKED)
        if plan.unread:  # an unreadable process may hold a GPU: ask NVML, from a fresh scan
            pins.close()
            plan, pins = scan(nvml=nvml_if_undecided())
        return plan, pins
    return scan(nvml=nvml)


def _announce(plan: PrestopPlan, on_event: Callable[[PrestopEvent], None]) -> None:
    on_event(PrestopEvent(0.0, "plan", None, _plan_line(plan)))
    for ex in plan.excluded:
        on_event(PrestopEvent(0.0, "exclude", ex.pid, f"leaving pid {ex.pid} ({ex.comm}) alone: {ex.reason}"))
    for u in plan.unread:
        on_event(PrestopEvent(0.0, "unread", u.pid, f"could not read pid {u.pid} ({u.comm}): {u.reason}"))


def run_prestop(
    *,
    procfs: Procfs | None = None,
    nvml: NvmlBackend | None = None,
    nvml_if_undecided: Callable[[], NvmlBackend] | None = None,
    timeout: float = PRESTOP_TIMEOUT,
    kill_wait: float = DEFAULT_KILL_WAIT,
    dry_run: bool = False,
    include_orphans: bool = True,
    same_cgroup: bool = False,
    scope: Scope | None = None,
    on_event: Callable[[PrestopEvent], None] = lambda e: None,
    clock: Callable[[], float] = time.monotonic,
) -> PrestopReport:
    """SIGTERM every GPU holder and orphan of this PID namespace, wait ``timeout``, SIGKILL the rest.

    Must run with its own namespace's procfs: inside the pod (a preStop exec hook does), or in the
    host's namespace with a ``scope`` (else GpuzombieError, exit 2). NVML is read once for the
    plan; the re-scans while waiting use /proc only. With ``nvml_if_undecided`` (and no ``nvml``)
    NVML is made and read only when the /proc scan left a process unread (the fast hook: NVML's
    start costs 0.13-0.2 s on an H200, and every CUDA process holds /dev/nvidia*).
    """
    procfs = procfs or Procfs()
    me = _own_pid(procfs)
    require_scope(reader_pidns(procfs.root), scope)  # before a single process is read
    started = time.time()
    t0 = clock()
    scan = functools.partial(
        plan_prestop, procfs=procfs, include_orphans=include_orphans, same_cgroup=same_cgroup, scope=scope, own_pid=me
    )
    plan, pins = _first_plan(scan, nvml, nvml_if_undecided)
    if not dry_run:
        _refuse_unpinned(plan, pins)
    _announce(plan, on_event)
    unread = {u.pid: u for u in plan.unread}

    def rescan() -> tuple[tuple[Target, ...], PinnedPids]:
        new_plan, new_pins = scan(nvml=None)
        unread.update((u.pid, u) for u in new_plan.unread if u.pid not in unread)
        return new_plan.targets, new_pins

    terminator = Terminator(procfs_root=procfs.root, rescan=rescan, dry_run=dry_run, on_event=on_event, clock=clock)
    results = terminator.run(plan.targets, pins, timeout=timeout, kill_wait=kill_wait)
    survivors = count_left_alive(r.outcome for r in results)
    if scope_missed(plan):
        status = ExitStatus.ERROR  # a mistyped --cgroup/--container must not look like "all gone"
    else:
        status = ExitStatus.FINDINGS if survivors or unread else ExitStatus.OK
    report = PrestopReport(
        schema=SCHEMA,
        started_at=started,
        duration_s=round(clock() - t0, 3),
        dry_run=dry_run,
        timeout_s=timeout,
        kill_wait_s=kill_wait,
        plan=plan,
        results=results,
        unread=tuple(unread.values()),
        incomplete=len(unread),
        survivors=survivors,
        exit_status=int(status),
    )
    on_event(PrestopEvent(report.duration_s, "done", None, summary_line(report)))
    return report


def scope_missed(plan: PrestopPlan) -> bool:
    """A scope was given and matched no process at all (not even this one): most likely mistyped."""
    return plan.scope is not None and plan.scope_matched == 0


def _plan_line(plan: PrestopPlan) -> str:
    gpu = "NVML available" if plan.gpu_available else f"NVML not used ({plan.gpu_reason})"
    where = "the host's PID namespace" if plan.in_root_pidns else f"pid namespace {plan.own_pidns}"
    scope = f", scope {plan.scope} ({plan.scope_matched} process(es))" if plan.scope else ""
    orphans = "orphans included" if plan.orphans_included else "orphans not swept"
    unread = f"; {len(plan.unread)} unread" if plan.unread else ""
    return f"{len(plan.targets)} target(s) in {where}{scope} (PID 1: {plan.pid1_command}); {orphans}; {gpu}{unread}"


def summary_line(report: PrestopReport) -> str:
    counts: dict[str, int] = {}
    for r in report.results:
        counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no targets"
    if scope_missed(report.plan):
        return f"ERROR: scope matched no process ({report.plan.scope}): nothing signalled in {report.duration_s:.2f} s"
    if report.dry_run:
        verdict = "DRY RUN"
    elif report.survivors:
        verdict = f"{report.survivors} SURVIVED"
    else:
        verdict = "INCOMPLETE" if report.incomplete else "OK"
    unread = f"; {report.incomplete} process(es) could not be read (not signalled)" if report.incomplete else ""
    return f"{verdict}: {parts}{unread} in {report.duration_s:.2f} s"


def render_text(report: PrestopReport) -> str:
    """The table a person reads after the run (the live log has the events); what processes
    control (comm, fd paths) is escaped, so no name can forge a line."""
    lines = [f"{'PID':>7}  {'COMM':<16} {'OUTCOME':<28} {'SIGNALS':<26} {'GONE_AFTER':>10}  REASONS"]
    for r in report.results:
        gone = f"{r.exited_after_s:.3f}s" if r.exited_after_s is not None else "-"
        lines.append(
            f"{r.target.pid:>7}  {escape(r.target.comm, 16):<16} {r.outcome.value:<28} "
            f"{','.join(r.signals) or '-':<26} {gone:>10}  {escape('; '.join(r.target.reasons), REASONS_LIMIT)}"
        )
    for pid, comm, outcome, reason in [
        *((ex.pid, ex.comm, "untouched", ex.reason) for ex in report.plan.excluded),
        *((u.pid, u.comm, "unread (untouched)", u.reason) for u in report.unread),
    ]:
        lines.append(f"{pid:>7}  {escape(comm, 16):<16} {outcome:<28} {'-':<26} {'-':>10}  {escape(reason)}")
    lines.append(summary_line(report))
    return "\n".join(lines)
