"""Which PID namespace the reader is in, and whether it is the host's: the one check every caller uses.

The kernel gives the initial (host) PID namespace a fixed inode number (``PROC_PID_INIT_INO``,
0xEFFFFFFC, since Linux 3.8); every other namespace gets a fresh one. ``/proc/<pid>/ns/pid`` names
it as ``pid:[<inode>]``. The NSpid chain cannot tell the two apart: inside a namespace with its own
/proc mounted (a container, ``nsenter -p -m``), NSpid shows one pid just as on the host.
"""

from __future__ import annotations

import os

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.proc.procfs import parse_ns_link

ROOT_PIDNS_INODE = 0xEFFFFFFC
"""The kernel's fixed inode of the initial PID namespace (PROC_PID_INIT_INO)."""


def is_root_pidns(inode: int | None) -> bool:
    """Is this PID-namespace inode the host's? None (unreadable) is not."""
    return inode == ROOT_PIDNS_INODE


def reader_pidns(procfs_root: str = "/proc") -> int | None:
    """The inode of this process's PID namespace, through ``<procfs_root>/self``; None when unreadable."""
    try:
        return parse_ns_link(os.readlink(os.path.join(procfs_root, "self", "ns", "pid")))
    except OSError:
        return None


def own_pid_in(procfs_root: str = "/proc") -> int:
    """This process's pid as ``procfs_root`` sees it (os.getpid() only when it is our namespace's)."""
    try:
        return int(os.readlink(os.path.join(procfs_root, "self")))
    except (OSError, ValueError) as exc:
        raise GpuzombieError(f"cannot read {procfs_root}/self: {exc}", ExitStatus.ERROR) from exc
