"""What both lab runtimes share: the ``LabPod`` interface a measurement drives, the ``Deletion`` it
returns, and the /proc look-ups that find a pod's processes by its PID namespace.

Two runtimes implement ``LabPod``: ``pidns.Pod`` (PID namespaces made here, ``lab run``'s default)
and ``manifestpod.ManifestPod`` (a pod manifest on a CRI runtime: ``lab pod``, and every scenario
of ``lab run --runtime containerd`` as a one-container manifest).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuzombie.proc.procfs import Procfs

HOST_PROCFS = Procfs()
"""A reader of this machine's /proc (``proc.own.PROCFS`` is its path): the lab runs its pods here."""
LEFTOVER_WAIT_S = 2.0
"""How long a deleted pod's processes may take to vanish (a shim or init reaping) before they count."""


def children_of(pid: int) -> list[int]:
    """Direct children from /proc/<pid>/task/*/children (empty when the process is gone)."""
    return HOST_PROCFS.children_pids(pid)


def pidns_of(pid: int) -> int | None:
    return HOST_PROCFS.pidns(pid)


def pids_in_pidns(pidns: int) -> list[int]:
    """Every host pid whose PID namespace is ``pidns`` (zombies included)."""
    return HOST_PROCFS.pids_in_pidns(pidns)


def pod_pid1(pidns: int) -> int | None:
    """The host pid of the PID namespace's init (its pid 1 there), or None when it has none."""
    table = HOST_PROCFS.snapshot(pids=pids_in_pidns(pidns), now=time.time(), with_cgroup=False)
    return next((p.pid for p in table if p.innermost_pid == 1), None)


def leftovers(processes: Callable[[], list[int]]) -> tuple[int, ...]:
    """The pod's processes still there ``LEFTOVER_WAIT_S`` after it exited (must be none)."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    left = processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = processes()
    return tuple(left)


@dataclass(frozen=True)
class Deletion:
    """What deleting the pod took, on the events' clock."""

    requested_at: float
    grace_s: float
    prestop_rc: int | None
    prestop_stdout: str
    prestop_stderr: str
    sigterm_at: float
    sigkill_at: float | None
    exited_at: float
    pod_exit_code: int | None
    leftovers: tuple[int, ...]


def pod_ids(pod: LabPod, namespace: str, name: str, uid: str, **more: int | str) -> dict[str, int | str]:
    """What names a lab pod in a run's record: its PID 1, main process and PID namespace, the pod,
    and ``more`` (its runtime's own ids)."""
    return {
        "pid1": pod.pid1,
        "main_pid": pod.main_pid,
        "pidns": pod.pidns,
        "pod": f"{namespace}/{name}",
        "pod_uid": uid,
        **more,
    }


class LabPod(Protocol):
    """What a measurement needs of a pod, on either runtime."""

    pid1: int
    """Host pid of the pod's PID 1 (the init, or the pause with shareProcessNamespace)."""
    main_pid: int
    """Host pid of the container's main process (PID 1 unless the pod shares its namespace)."""
    pidns: int

    @property
    def running(self) -> bool: ...
    @property
    def command_line(self) -> str: ...
    @property
    def ids(self) -> dict[str, int | str]: ...
    def start(self) -> None: ...
    def processes(self) -> list[int]: ...
    def tree(self) -> list[int]: ...
    def log_text(self) -> str: ...
    def container_exited(self) -> bool: ...
    def exec(self, argv: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]: ...
    def delete(self, *, grace: float) -> Deletion:
        """The kubelet's order: the pod's preStop hook, SIGTERM, SIGKILL at the grace's end."""
        ...

    def kill(self) -> None:
        """Backstop: whatever is left of the pod goes, whatever happened."""
        ...
