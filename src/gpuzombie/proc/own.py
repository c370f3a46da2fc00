"""The /proc this process runs under (not a node's /host/proc or a test's tree): its path, PID 1's
stdout, and the machine facts a lab run records. Standard library only: the preStop hook uses it."""

from __future__ import annotations

import os

from gpuzombie.proc.parse import parse_cpu_model, parse_mem_available, parse_mount_points
from gpuzombie.proc.read import read_text

PROCFS = "/proc"
"""Where this process's own procfs is mounted: the default of every procfs root."""
PID1_STDOUT = os.path.join(PROCFS, "1", "fd", "1")
"""PID 1's stdout: in a container, the stream ``kubectl logs`` shows."""


def open_pid1_stdout(path: str = PID1_STDOUT) -> tuple[int | None, str | None]:
    """A non-blocking write end of PID 1's stdout and None, or None and why there is none.

    Non-blocking, so a full pipe drops lines rather than hanging the writer; refused when it is the
    same file as our own stdout (every line would show twice)."""
    try:
        target = os.stat(path)
    except OSError as exc:
        return None, f"cannot stat {path}: {exc.strerror}"
    try:
        mine = os.fstat(1)
        if (mine.st_dev, mine.st_ino) == (target.st_dev, target.st_ino):
            return None, "PID 1's stdout is our own stdout"
    except OSError:
        pass
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC), None
    except OSError as exc:
        return None, f"cannot open {path}: {exc.strerror}"


def open_fd_count(procfs_root: str = PROCFS) -> int | None:
    """How many files this process has open (its fd/ entries, less the one listing them); None when
    that cannot be listed."""
    try:
        return len(os.listdir(os.path.join(procfs_root, "self", "fd"))) - 1
    except OSError:
        return None


def cgroup_v2_only(procfs_root: str = PROCFS) -> bool:
    """Does this process sit in the unified (v2) hierarchy alone? False for v1, hybrid or unreadable."""
    try:
        return read_text(os.path.join(procfs_root, "self", "cgroup"), "cgroup").strip().startswith("0::")
    except OSError:
        return False


def cpu_model(procfs_root: str = PROCFS) -> str | None:
    """The first CPU's model name from cpuinfo; None when unreadable or not given (e.g. on arm64)."""
    try:
        return parse_cpu_model(read_text(os.path.join(procfs_root, "cpuinfo"), "cpuinfo"))
    except OSError:
        return None


def mem_available(procfs_root: str = PROCFS) -> int | None:
    """Host memory that can be allocated without swapping (MemAvailable), in bytes; None when unreadable."""
    try:
        return parse_mem_available(read_text(os.path.join(procfs_root, "meminfo"), "meminfo"))
    except OSError:
        return None


def mount_points_under(path: str, procfs_root: str = PROCFS) -> list[str]:
    """Every mount point at or below ``path`` in this process's mount namespace, deepest first. From
    mountinfo, not ``os.path.ismount``: a bind mount of a directory of the same filesystem (the
    kubelet's root dir onto itself) has the same device as its parent and looks like no mount."""
    prefix = path.rstrip("/") + "/"
    text = read_text(os.path.join(procfs_root, "self", "mountinfo"), "mountinfo")
    found = {p for p in parse_mount_points(text) if p == path.rstrip("/") or p.startswith(prefix)}
    return sorted(found, key=lambda p: (p.count("/"), len(p)), reverse=True)
