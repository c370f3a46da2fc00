"""A process pinned by its identity, so a recycled pid is never signalled.

A process is (pid, start time): a later process with the same pid has another start time. Where the
kernel has pidfds (Linux 5.3+, Python 3.9+), ``ProcessHandle.open`` opens a pidfd *first* and then
re-reads the start time: if it still matches, the pidfd refers to the process we planned for, and
every later signal goes through that pidfd, which can never reach a different process. Without
pidfds the start time is re-checked right before each ``kill()`` (a race of microseconds remains).
"""

from __future__ import annotations

import math
import os
import select
import signal
from dataclasses import dataclass
from enum import Enum

from gpuzombie.proc.procfs import parse_stat


@dataclass(frozen=True)
class ProcessIdentity:
    """What a planned target was: its pid alone could name a later process after a reap."""

    pid: int
    start_ticks: int


class Liveness(str, Enum):
    ALIVE = "alive"
    EXITED = "exited"
    """Exited: gone, or a zombie (a zombie holds no memory, GPU memory included)."""
    REUSED = "reused"
    """The pid now belongs to a different, later process."""


def read_start_and_state(procfs_root: str, pid: int) -> tuple[int, str] | None:
    """(start ticks, state) of whatever process has ``pid`` now; None when there is none."""
    try:
        with open(os.path.join(procfs_root, str(pid), "stat")) as f:
            stat = parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return stat.start_ticks, stat.state


def check_identity(procfs_root: str, identity: ProcessIdentity) -> Liveness:
    """Is the process with ``identity.pid`` now still the one planned for (same start time)?"""
    now = read_start_and_state(procfs_root, identity.pid)
    if now is None:
        return Liveness.EXITED
    start, state = now
    if start != identity.start_ticks:
        return Liveness.REUSED
    return Liveness.EXITED if state in ("Z", "X") else Liveness.ALIVE


def pidfds_supported() -> bool:
    """Python 3.9+ on Linux has both calls; the kernel may still refuse (ENOSYS before 5.3)."""
    return hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


class ProcessHandle:
    """The one way prestop signals a process."""

    def __init__(self, identity: ProcessIdentity, procfs_root: str, pidfd: int | None) -> None:
        self.identity = identity
        self.procfs_root = procfs_root
        self.pidfd = pidfd

    @classmethod
    def open(
        cls, identity: ProcessIdentity, procfs_root: str, use_pidfd: bool = True
    ) -> tuple[ProcessHandle | None, Liveness]:
        """Pin the process; (None, why) when it is already gone or its pid was reused."""
        pidfd = None
        if use_pidfd and pidfds_supported():
            try:
                pidfd = os.pidfd_open(identity.pid)
            except ProcessLookupError:
                return None, check_identity(procfs_root, identity)
            except OSError:
                pidfd = None  # e.g. ENOSYS on an old kernel: fall back to kill()
        # Checked after opening: the pidfd now pins whatever had the pid at open time, and that is
        # our process exactly when the start time still matches.
        state = check_identity(procfs_root, identity)
        if state is not Liveness.ALIVE:
            if pidfd is not None:
                os.close(pidfd)
            return None, state
        return cls(identity, procfs_root, pidfd), state

    def liveness(self) -> Liveness:
        """A readable pidfd means the process exited (zombie included); else /proc decides."""
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            if poller.poll(0):
                return Liveness.EXITED
        return check_identity(self.procfs_root, self.identity)

    def send(self, sig: int) -> Liveness:
        """Re-check the identity, then signal; returns the liveness seen just before."""
        state = self.liveness()
        if state is not Liveness.ALIVE:
            return state
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.identity.pid, sig)
        except ProcessLookupError:
            return Liveness.EXITED
        return Liveness.ALIVE

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def wait_any_exit(handles: list[ProcessHandle], timeout: float) -> None:
    """Sleep up to ``timeout`` s, waking early when a pinned process exits.

    Only a pidfd can wake us: when any handle has none (no pidfd support), the caller's /proc
    re-check runs every 50 ms instead."""
    timeout = max(0.0, timeout)
    if any(h.pidfd is None for h in handles):
        timeout = min(timeout, 0.05)
    poller = select.poll()
    for h in handles:
        if h.pidfd is not None:
            poller.register(h.pidfd, select.POLLIN)
    poller.poll(math.ceil(timeout * 1000))  # rounded up: a sub-millisecond rest must not spin
