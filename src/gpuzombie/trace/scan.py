"""Pick the processes a node trace is about, cheaply, before reading them in full.

A node has thousands of processes and a handful that matter: those NVML lists, those holding
``/dev/nvidia*`` and zombies. Reading one ``stat`` and one fd directory per pid finds them; only
they are read in full (cmdline, status, cgroup, namespaces) through the foundation's ``Procfs``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gpuzombie.proc.procfs import ProcessTable, Procfs, fd_targets


def _state(root: str, pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (after the last ')'); None when gone."""
    try:
        fd = os.open(f"{root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    close = raw.rfind(b")")
    return chr(raw[close + 2]) if 0 <= close < len(raw) - 2 else None


def _is_relevant(root: str, pid: int, prefix: str) -> bool:
    """Holds a /dev/nvidia* fd, or is a zombie. Reads stat only when the fd directory is empty or
    closed to us (a zombie has released all its files)."""
    try:
        targets = fd_targets(f"{root}/{pid}/fd")
    except OSError:
        targets = []
    if any(target.startswith(prefix) for target in targets):
        return True
    return not targets and _state(root, pid) == "Z"


def relevant_pids(procfs: Procfs, gpu_pids: Iterable[int], *, skip: int | None = None) -> list[int]:
    """Pids of zombies, /dev/nvidia* holders and ``gpu_pids`` present in the tree, ascending."""
    wanted = set(gpu_pids)
    root, prefix = procfs.root, procfs.device_prefix
    return [pid for pid in procfs.pids() if pid != skip and (pid in wanted or _is_relevant(root, pid, prefix))]


def scan(procfs: Procfs, gpu_pids: Iterable[int], *, now: float, skip: int | None = None) -> ProcessTable:
    """A ProcessTable of just the relevant processes (raises OSError when the tree is unreadable)."""
    return procfs.snapshot(relevant_pids(procfs, gpu_pids, skip=skip), now=now)


def is_live_procfs(root: str) -> bool:
    """A kernel procfs (not a test's or a recording's tree): there, reading others' fds needs root."""
    return os.path.exists(os.path.join(root, "self", "status")) and os.path.exists(os.path.join(root, "1"))
