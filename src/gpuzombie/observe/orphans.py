"""Zombies (state Z) and orphans (alive, re-parented to PID 1), each with the evidence for it.

A child of PID 1 is not an orphan by itself: PID 1 may have started it. What tells them apart:

* PID 1 is a single-child init (tini, dumb-init, catatonit, docker-init): it starts exactly one
  child, the oldest; every other child of PID 1 was re-parented to it;
* PID 1 is the pause container or a program that never forks after its exec (``sleep``): it
  started none of them (only a job its shell forked before ``exec sleep`` could be its own);
* the process's group or session leader has exited: the job that started it is gone.

Processes with parent pid 0 were entered from outside (``kubectl exec``, ``nsenter``): not children
of PID 1, never orphans. Where no evidence applies the answer is "cannot tell".
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuzombie.observe.pid1 import Pid1
from gpuzombie.pid1kinds import Pid1Kind
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable

ORPHAN = "orphan"
CANNOT_TELL = "cannot_tell"


@dataclass(frozen=True)
class Zombie:
    """A process that has exited and waits for its parent to reap it."""

    pid: int
    local_pid: int
    ppid: int
    comm: str
    parent_comm: str | None
    age_s: float
    """Seconds since the process started (the kernel does not record when it exited)."""
    reaped_by: str
    """Who can reap it, and whether anyone will."""


@dataclass(frozen=True)
class Orphan:
    """A live child of PID 1, and whether the evidence says it was re-parented."""

    pid: int
    local_pid: int
    ppid: int
    comm: str
    command: str
    age_s: float
    verdict: str
    """"orphan" when some evidence applies, "cannot_tell" when none does."""
    evidence: tuple[str, ...]


def reader_chain(table: ProcessTable, own_pid: int | None) -> tuple[int, ...]:
    """The reader and its ancestors up to the one entered from outside (parent pid 0), PID 1 excluded.

    ``nsenter ... sh -c 'gpuzombie observe'`` puts sh and python in the namespace: both are the
    observer, not findings.
    """
    chain: list[int] = []
    pid = own_pid
    while pid is not None and pid != 1 and pid not in chain:
        proc = table.get(pid)
        if proc is None:
            break
        chain.append(pid)
        pid = proc.ppid if proc.ppid != 0 else None
    return tuple(chain)


def _dead(table: ProcessTable, pid: int) -> bool:
    proc = table.get(pid)
    return proc is None or proc.is_zombie


def _leader_evidence(table: ProcessTable, proc: ProcessInfo) -> list[str]:
    """Evidence from a dead process-group or session leader (0 = a leader outside this namespace)."""
    found = []
    if proc.pgid > 0 and proc.pgid != proc.pid and _dead(table, proc.pgid):
        found.append(f"its process-group leader (pid {proc.pgid}) has exited")
    if proc.sid > 0 and proc.sid != proc.pid and _dead(table, proc.sid):
        found.append(f"its session leader (pid {proc.sid}) has exited")
    return found


def _started_child(children: list[ProcessInfo]) -> ProcessInfo | None:
    """The child a single-child init started: the oldest (its descendants came later)."""
    return min(children, key=lambda p: (p.start_ticks, p.pid), default=None)


def _pid1_evidence(pid1: Pid1, started: ProcessInfo | None, proc: ProcessInfo) -> str | None:
    name = pid1.program
    if pid1.kind is Pid1Kind.INIT and started is not None and proc.pid != started.pid:
        return (
            f"PID 1 is {name}, which starts exactly one child (pid {started.pid}, "
            f"{started.comm}); every other child was re-parented to it"
        )
    if pid1.kind is Pid1Kind.PAUSE:
        return "PID 1 is pause, which starts no process: every child of it was re-parented"
    if pid1.kind is Pid1Kind.NON_FORKING:
        return (
            f"PID 1 is {name}, which forks nothing after its exec: its children were "
            "re-parented (or forked by its shell before the exec)"
        )
    return None


def find_orphans(
    table: ProcessTable, pid1: Pid1, *, exclude: frozenset[int] = frozenset(), now: float
) -> tuple[Orphan, ...]:
    """Every live child of PID 1 not started by it per the evidence, plus the undecidable ones."""
    if table.get(1) is None:
        return ()
    children = table.children(1)
    started = _started_child(children) if pid1.kind is Pid1Kind.INIT else None
    found = []
    for proc in children:
        if proc.is_zombie or proc.pid in exclude:
            continue
        if started is not None and proc.pid == started.pid:
            continue  # the init's own child
        evidence = [e for e in (_pid1_evidence(pid1, started, proc),) if e]
        evidence += _leader_evidence(table, proc)
        if not evidence and pid1.kind is Pid1Kind.SUPERVISOR:
            continue  # a supervisor's children are its services unless evidence says otherwise
        found.append(
            Orphan(
                **proc.named(),
                ppid=proc.ppid,
                command=proc.command,
                age_s=_age(proc, now),
                verdict=ORPHAN if evidence else CANNOT_TELL,
                evidence=tuple(evidence),
            )
        )
    return tuple(found)


def _age(proc: ProcessInfo, now: float) -> float:
    """Seconds since it started, to a tenth (never negative: the clocks are read apart)."""
    return round(max(0.0, now - proc.start_time), 1)


def _reaped_by(table: ProcessTable, pid1: Pid1, proc: ProcessInfo) -> str:
    parent = table.get(proc.ppid)
    if parent is None:
        return "its parent is outside this PID namespace"
    if parent.pid == 1:
        if pid1.is_reaping_init:
            return f"PID 1 ({pid1.program}) reaps it (transient)"
        return f"nobody: PID 1 ({pid1.program}) never calls wait(); it stays until the namespace (container) ends"
    if parent.is_zombie:
        return f"its parent {parent.pid} ({parent.comm}) is a zombie too; PID 1 inherits it when that is reaped"
    return (
        f"only its parent {parent.pid} ({parent.comm}), which is alive and has not called wait(): "
        "no init can reap it until that parent waits or exits"
    )


def find_zombies(table: ProcessTable, pid1: Pid1, *, now: float) -> tuple[Zombie, ...]:
    """Every process in state Z, with its parent and who (if anyone) will reap it."""
    found = []
    for proc in table:
        if not proc.is_zombie:
            continue
        parent = table.get(proc.ppid)
        found.append(
            Zombie(
                **proc.named(),
                ppid=proc.ppid,
                parent_comm=parent.comm if parent else None,
                age_s=_age(proc, now),
                reaped_by=_reaped_by(table, pid1, proc),
            )
        )
    return tuple(found)
