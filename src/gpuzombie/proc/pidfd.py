"""Process handles that can never signal a recycled pid: every signal goes through a pidfd.

A pid is only a number: once its process is reaped the kernel may hand it to a new one, even within
the same clock tick, so (pid, start time) cannot tell them apart (forced reuse hit that 44 times in
100). A pidfd refers to one process for as long as it is open. Opened *before* the process's files
are read (``PinnedPids``), it makes the read and the later signal refer to the same process: if the
pidfd's process is still alive after the read, the read was of it. ``ProcessHandle.open`` pins a
process known from an earlier read instead; its start time is checked once after opening, which
misses only a reuse within that read's clock tick.
"""

from __future__ import annotations

import errno
import math
import os
import resource
import select
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.proc.own import PROCFS, open_fd_count
from gpuzombie.proc.parse import parse_stat
from gpuzombie.proc.read import read_text


@dataclass(frozen=True)
class ProcessIdentity:
    """What a read process was: its pid alone could name a later process after a reap."""

    pid: int
    start_ticks: int


class Liveness(str, Enum):
    ALIVE = "alive"
    EXITED = "exited"
    """Exited: gone, or a zombie (a zombie holds no memory, GPU memory included)."""
    REUSED = "reused"
    """The pid now belongs to a different, later process."""


def read_start_and_state(procfs_root: str, pid: int) -> tuple[int, str] | None:
    """(start ticks, state) of whatever process has ``pid`` now; None when there is none (or its
    stat cannot be used: the hardened reader never blocks on, nor floods from, a hostile tree)."""
    try:
        fields = parse_stat(read_text(os.path.join(procfs_root, str(pid), "stat"), "stat"))
    except (OSError, ValueError):
        return None
    return fields.start_ticks, fields.state


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` in this process's PID namespace; None when there is no such process.

    Raises GpuzombieError (exit 2) when the kernel has no pidfds (before Linux 5.3): there is no
    safe way to signal then, so nothing is signalled."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            raise GpuzombieError(
                "this kernel has no pidfd_open (Linux 5.3 or later is needed): refusing to signal by pid",
                ExitStatus.ERROR,
            ) from exc
        raise


def _has_exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (a zombie included)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _verify(pidfd: int, identity: ProcessIdentity, procfs_root: str) -> Liveness:
    """Is the process behind ``pidfd`` the one ``identity`` names? Read /proc first, poll second:
    a process still alive after the read is the one that was read."""
    now = read_start_and_state(procfs_root, identity.pid)
    if now is None or now[1] in ("Z", "X") or _has_exited(pidfd):
        return Liveness.EXITED
    return Liveness.ALIVE if now[0] == identity.start_ticks else Liveness.REUSED


class ProcessHandle:
    """A process held through its pidfd: the one way gpuzombie signals a process."""

    def __init__(self, identity: ProcessIdentity, pidfd: int) -> None:
        self.identity = identity
        self.pidfd: int | None = pidfd

    @classmethod
    def open(cls, identity: ProcessIdentity, procfs_root: str = PROCFS) -> tuple[ProcessHandle | None, Liveness]:
        """Pin a process known from an earlier read; (None, why) when it is gone or its pid was reused.

        ``procfs_root`` must be this process's own PID namespace's procfs (pidfd_open takes our pids)."""
        return cls.adopt(open_pidfd(identity.pid), identity, procfs_root)

    @classmethod
    def adopt(
        cls, pidfd: int | None, identity: ProcessIdentity, procfs_root: str
    ) -> tuple[ProcessHandle | None, Liveness]:
        """Own ``pidfd`` if its process is ``identity`` (checked once, now); else close it: (None, why)."""
        if pidfd is None:
            return None, Liveness.EXITED
        state = _verify(pidfd, identity, procfs_root)
        if state is not Liveness.ALIVE:
            os.close(pidfd)
            return None, state
        return cls(identity, pidfd), state

    def liveness(self) -> Liveness:
        """ALIVE until the process exits (becoming a zombie counts); a closed handle is EXITED."""
        if self.pidfd is None or _has_exited(self.pidfd):
            return Liveness.EXITED
        return Liveness.ALIVE

    def send(self, sig: int) -> Liveness:
        """Signal the process through its pidfd; returns EXITED (nothing sent) when it has exited.

        Raises PermissionError when the kernel refuses the signal."""
        if self.liveness() is not Liveness.ALIVE:
            return Liveness.EXITED
        assert self.pidfd is not None
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            return Liveness.EXITED
        return Liveness.ALIVE

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


RESERVED_FDS = 64
"""Files kept free while pinning, for the scan that follows (a /proc file, an fd/ directory, a log)."""
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE})


def open_files_limit() -> str:
    """The open-files limit, as a person raises it: ``ulimit -n 1024 (hard 1024)``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def show(n: int) -> str:
        return "unlimited" if n == resource.RLIM_INFINITY else str(n)

    return f"ulimit -n {show(soft)} (hard {show(hard)})"


def _fd_budget(reserve: int) -> int | None:
    """How many more files may be opened with ``reserve`` left free; None when unknown or unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = open_fd_count()
    if soft == resource.RLIM_INFINITY or in_use is None:
        return None
    return max(0, soft - in_use - reserve)


class PinnedPids:
    """pidfds opened before a snapshot reads the processes, so what was read is what gets signalled.

    ``take`` hands one over once the snapshot has read its process; ``close`` releases the rest.
    ``unpinned`` says why a pid has none: the open-files limit (``RESERVED_FDS`` stay free for the
    scan, so running out never fails the scan itself), or another error. Such a process is never
    signalled; ``out_of_fds`` tells the caller the limit was the reason.
    """

    def __init__(self, pids: Iterable[int], *, reserve: int = RESERVED_FDS) -> None:
        self._pidfds: dict[int, int] = {}
        self.unpinned: dict[int, str] = {}
        self.out_of_fds = False
        budget = _fd_budget(reserve)
        try:
            for pid in pids:
                if self.out_of_fds or (budget is not None and len(self._pidfds) >= budget):
                    self.out_of_fds = True
                    self.unpinned[pid] = f"no pidfd: the open-files limit is reached ({open_files_limit()})"
                    continue
                try:
                    pidfd = open_pidfd(pid)
                except OSError as exc:
                    if exc.errno in _OUT_OF_FDS:
                        self.out_of_fds = True
                        self.unpinned[pid] = f"no pidfd: the open-files limit is reached ({open_files_limit()})"
                    else:
                        self.unpinned[pid] = f"no pidfd: {exc.strerror}"
                    continue
                if pidfd is not None:
                    self._pidfds[pid] = pidfd
            if self.out_of_fds:
                self._free_reserve(reserve)
        except BaseException:
            self.close()
            raise

    def _free_reserve(self, reserve: int) -> None:
        """After EMFILE the scan still needs files: give back the last pins until ``reserve`` are free."""
        budget = _fd_budget(0)
        while budget is not None and budget < reserve and self._pidfds:
            pid, pidfd = self._pidfds.popitem()
            os.close(pidfd)
            self.unpinned[pid] = f"no pidfd: the open-files limit is reached ({open_files_limit()})"
            budget += 1

    def __contains__(self, pid: object) -> bool:
        """Holds a pidfd for ``pid`` (opened before the scan read it), not yet taken."""
        return pid in self._pidfds

    def __enter__(self) -> PinnedPids:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self, identity: ProcessIdentity, procfs_root: str) -> tuple[ProcessHandle | None, Liveness]:
        """The handle of the process read as ``identity``; (None, why) when it exited since.

        Its start time is checked once, after the pidfd was opened: equal and still alive means the
        pidfd is the process the snapshot read (pinned first, read second)."""
        return ProcessHandle.adopt(self._pidfds.pop(identity.pid, None), identity, procfs_root)

    def close(self) -> None:
        for pidfd in self._pidfds.values():
            os.close(pidfd)
        self._pidfds.clear()


def wait_any_exit(handles: Iterable[ProcessHandle], timeout: float) -> None:
    """Sleep up to ``timeout`` s, waking early when a held process exits."""
    poller = select.poll()
    for h in handles:
        if h.pidfd is not None:
            poller.register(h.pidfd, select.POLLIN)
    poller.poll(math.ceil(max(0.0, timeout) * 1000))  # rounded up: a sub-millisecond rest must not spin
