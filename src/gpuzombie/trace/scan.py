"""Pick the processes a node trace is about, cheaply, before reading them in full.

A node has thousands of processes and a handful that matter: those NVML lists, those holding
``/dev/nvidia*`` and zombies. Reading one ``stat`` and one fd directory per pid finds them; only
they are read in full (cmdline, status, cgroup, namespaces) through the foundation's ``Procfs``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gpuzombie.proc.procfs import Procfs, ProcessTable


def _state(procfs: Procfs, pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (after the last ')'); None when gone."""
    try:
        with open(procfs.path(pid, "stat"), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    close = raw.rfind(b")")
    return chr(raw[close + 2]) if 0 <= close < len(raw) - 2 else None


def relevant_pids(procfs: Procfs, gpu_pids: Iterable[int], *, skip: int | None = None) -> list[int]:
    """Pids of zombies, /dev/nvidia* holders and ``gpu_pids`` present in the tree, ascending."""
    wanted = set(gpu_pids)
    found = []
    for pid in procfs.pids():
        if pid == skip:
            continue
        if pid in wanted:
            found.append(pid)
            continue
        state = _state(procfs, pid)
        if state is None:
            continue
        if state == "Z" or procfs.nvidia_fds(pid):
            found.append(pid)
    return found


def scan(procfs: Procfs, gpu_pids: Iterable[int], *, now: float, skip: int | None = None) -> ProcessTable:
    """A ProcessTable of just the relevant processes (raises OSError when the tree is unreadable)."""
    return procfs.snapshot(relevant_pids(procfs, gpu_pids, skip=skip), now=now)


def is_live_procfs(root: str) -> bool:
    """A kernel procfs (not a test's or a recording's tree): there, reading others' fds needs root."""
    return os.path.exists(os.path.join(root, "self", "status")) and os.path.exists(os.path.join(root, "1"))
