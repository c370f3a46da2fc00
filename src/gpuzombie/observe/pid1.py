"""Who is PID 1, and does it do an init's job (reap every zombie, forward signals)?

The answer decides how the rest of the report reads the tree: under a single-child init every other
child of PID 1 was re-parented to it; under ``sleep`` nothing is reaped and every child of PID 1 is
either re-parented or was forked before the shell exec'd ``sleep``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuzombie.pid1kinds import KINDS, REAPING_KINDS, Pid1Kind
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable

PAUSE_FLAG = "-P"
"""``catatonit -P`` is a pause container (it starts no child), not a single-child init: without it,
observe took the oldest re-parented worker for catatonit's own child and called S5's orphan none."""

_NOTES = {
    Pid1Kind.INIT: "a reaping init: reaps every zombie re-parented to it and forwards signals to its one child",
    Pid1Kind.SUPERVISOR: "a reaping init (service supervisor): reaps re-parented zombies",
    Pid1Kind.PAUSE: "the pause container: reaps re-parented zombies, starts no process itself",
    Pid1Kind.NON_FORKING: "NOT an init: never calls wait(), so every process re-parented to it "
    "stays a zombie after it exits; SIGTERM is not forwarded",
    Pid1Kind.SHELL: "NOT an init: a shell reaps only while it waits for its own jobs and does not "
    "forward SIGTERM to them",
    Pid1Kind.PROGRAM: "NOT an init: reaps nothing it did not start itself, forwards no signals",
    Pid1Kind.UNKNOWN: "PID 1 is not readable here",
}


@dataclass(frozen=True)
class Pid1:
    """PID 1 of the namespace that was read."""

    pid: int
    comm: str | None
    command: str | None
    program: str | None
    """The name the kind was decided on (the basename of argv[0], or the comm)."""
    kind: Pid1Kind
    is_reaping_init: bool
    note: str


def program_name(proc: ProcessInfo) -> str:
    """The name to classify on: a known argv[0] basename (``/usr/bin/tini`` -> ``tini``), else comm.

    argv[0] wins because comm is truncated to 15 characters and a symlinked ``/sbin/init`` keeps
    its target's comm; comm wins when argv[0] is unknown (an interpreter running a script).
    """
    argv0 = os.path.basename(proc.cmdline[0]) if proc.cmdline else ""
    if argv0 in KINDS:
        return argv0
    if proc.comm in KINDS:
        return proc.comm
    return argv0 or proc.comm


def classify(proc: ProcessInfo | None) -> Pid1:
    """Classify the process that is PID 1 (``None`` when it could not be read)."""
    if proc is None:
        return Pid1(
            pid=1,
            comm=None,
            command=None,
            program=None,
            kind=Pid1Kind.UNKNOWN,
            is_reaping_init=False,
            note=_NOTES[Pid1Kind.UNKNOWN],
        )
    name = program_name(proc)
    kind = KINDS.get(name, Pid1Kind.PROGRAM)
    if name == "catatonit" and PAUSE_FLAG in proc.cmdline[1:]:
        kind = Pid1Kind.PAUSE  # podman's infra and the lab's S5 pause: no child of its own
    return Pid1(
        pid=proc.pid,
        comm=proc.comm,
        command=proc.command,
        program=name,
        kind=kind,
        is_reaping_init=kind in REAPING_KINDS,
        note=_NOTES[kind],
    )


def find_pid1(table: ProcessTable) -> Pid1:
    """PID 1 of the tree that was read (the container's init, or the host's)."""
    return classify(table.get(1))
