"""The one hardened way to read a procfs file: regular files only, never blocking, never unbounded.

A procfs tree may be hostile (a container mounts what it likes as its /proc; a test or a recording
holds anything): a FIFO would block ``open``/``read`` forever, a ``/dev/zero`` link would fill
memory. So every file is opened ``O_NONBLOCK | O_NOFOLLOW``, checked with ``fstat`` to be a regular
file, and read up to a cap for its kind. What could not be read is described by an ``Unreadable``
(the file and why), so a caller keeps the process and says what it misses.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

KIB = 1024

CAPS: dict[str, int] = {
    "stat": 4 * KIB,  # ~300 bytes; comm is at most 64 bytes
    "status": 64 * KIB,  # ~1.5 KiB; the Cpus/Mems masks grow with the machine
    "cmdline": 64 * KIB,  # truncated, not refused: only argv[0..1] and a display string are used
    "cgroup": 64 * KIB,  # one line per hierarchy (13 on cgroup v1)
    "wchan": 256,
    "statm": 256,
    "boot_id": 64,  # a UUID and a newline
    "children": 64 * KIB,
    "proc_stat": 4 * 1024 * KIB,  # /proc/stat: a line per CPU and one per interrupt source
    "cpuinfo": 64 * KIB,  # truncated: only the first CPU's lines are used
    "meminfo": 16 * KIB,  # ~1.5 KiB: one line per counter
    "mountinfo": 4 * 1024 * KIB,  # a line per mount (~150 bytes): a busy node's pods make thousands
}
"""The most bytes read from each kind of file. Larger is refused (``too_large``), except the truncated kinds."""

TRUNCATED_KINDS = frozenset({"cmdline", "cpuinfo"})
PAGED_KINDS = frozenset({"mountinfo", "children"})
"""procfs files the kernel hands over a page of records per read (seq_file iterators): read to the
end. A single read of a node's mountinfo stopped at 4 KiB, so ``cluster down`` missed the kubelet's
bind mount of its root whenever more than a page of mounts (other pods') came before it."""


class Reason(str, Enum):
    """Why a file of a process could not be used."""

    ACCESS_DENIED = "access_denied"
    """EACCES/EPERM: another user's process read without root, or a hardened init."""
    MISSING = "missing"
    """Absent while the process's stat is still there (a fake or recorded tree, a kernel quirk)."""
    NOT_REGULAR = "not_regular"
    """A FIFO, a device, a socket, a directory or a symlink where a regular file belongs."""
    TOO_LARGE = "too_large"
    """Longer than the cap for its kind."""
    MALFORMED = "malformed"
    """Read, but its content does not parse."""
    ERROR = "error"
    """Any other I/O error."""


@dataclass(frozen=True)
class Unreadable:
    """One file of one process that could not be used, and why."""

    file: str
    reason: Reason
    detail: str = ""


class HostileFile(OSError):
    """A file that is not a regular file, or larger than its cap: refused without reading it all."""

    def __init__(self, path: str, reason: Reason, detail: str) -> None:
        super().__init__(errno.EINVAL, detail, path)
        self.reason = reason


# errno values meaning "this file's process is gone" (ESRCH comes from reads of a task that just
# exited; ENOTDIR when the pid directory was replaced).
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH, errno.ENOTDIR})
_DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW


def reason_of(exc: OSError) -> Reason:
    """Classify a failed read (a gone file counts as missing: the caller decides what gone means)."""
    if isinstance(exc, HostileFile):
        return exc.reason
    if exc.errno in _DENIED_ERRNOS:
        return Reason.ACCESS_DENIED
    if exc.errno in GONE_ERRNOS:
        return Reason.MISSING
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink (a /dev/zero link, say)
        return Reason.NOT_REGULAR
    return Reason.ERROR


def unreadable(file: str, exc: OSError | ValueError) -> Unreadable:
    """The Unreadable for a failed read (OSError) or parse (ValueError) of ``file``."""
    if isinstance(exc, ValueError):
        return Unreadable(file, Reason.MALFORMED, str(exc)[:200])
    return Unreadable(file, reason_of(exc), exc.strerror or str(exc))


def _read(path: str, kind: str) -> tuple[bytes, os.stat_result]:
    cap = CAPS[kind]
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HostileFile(path, Reason.NOT_REGULAR, f"not a regular file ({stat.filemode(info.st_mode)})")
        # A short read is the end: a regular file and most procfs files hand over what they hold at
        # once; a paged one a page at a time, until a read returns nothing.
        data = os.read(fd, cap + 1)
        while kind in PAGED_KINDS and len(data) <= cap and (more := os.read(fd, cap + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > cap:
        if kind not in TRUNCATED_KINDS:
            raise HostileFile(path, Reason.TOO_LARGE, f"larger than {cap} bytes")
        data = data[:cap]
    return data, info


def read_capped(path: str, kind: str) -> bytes:
    """The bytes of a regular file, at most ``CAPS[kind]`` of them.

    Raises OSError: the kernel's (ENOENT, EACCES, ELOOP for a symlink, ...) or HostileFile for a
    non-regular file or one over its cap (the ``TRUNCATED_KINDS`` are truncated instead).
    """
    return _read(path, kind)[0]


def read_owned(path: str, kind: str) -> tuple[bytes, int]:
    """``read_capped`` and the file's owner (for /proc/<pid>/* the process's effective uid)."""
    data, info = _read(path, kind)
    return data, info.st_uid


def read_text(path: str, kind: str) -> str:
    """``read_capped`` decoded (undecodable bytes replaced: a process names itself as it likes)."""
    return read_capped(path, kind).decode(errors="replace")


@dataclass
class Deadline:
    """A point in monotonic time a scan must end by; processes not read by then are reported as such."""

    seconds: float
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.ends_at = self.clock() + self.seconds

    @property
    def expired(self) -> bool:
        return self.clock() >= self.ends_at
