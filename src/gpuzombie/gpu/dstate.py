"""D-state GPU holders: processes in uninterruptible sleep (state D) that hold GPU memory or a
/dev/nvidia* fd, and how long each has been seen so across scans.

A process stuck in D inside the driver does not die of SIGKILL (the signal waits until it leaves D),
so the memory it holds stays; when it stays in D, only a drain and a reboot free the GPU (Meta GCM's
``check-dstate``, microsoft/pai#3372). A short D is normal (a page fault, a driver call), so one scan
only names them; the exporter's ``DStateTracker`` times them across scans, a process being
(pid, start time), as ``proc/`` tells a process from a later one with the same pid.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuzombie.gpu.attribution import Attribution, ProcessVerdict
from gpuzombie.jsonout import IN_MIB
from gpuzombie.proc.procfs import ProcessTable

D_STATE = "D"


@dataclass(frozen=True)
class DStateHolder:
    """A process in state D that NVML lists with memory or that holds /dev/nvidia*."""

    pid: int
    """The pid in the procfs read (the host pid on a node)."""
    local_pid: int
    start_ticks: int
    comm: str
    gpu_memory: int = field(metadata=IN_MIB)
    """Bytes NVML attributes to it, over all GPUs (0 when it holds only fds, or NVML gave no amount)."""
    gpus: tuple[int, ...]
    """The GPUs NVML lists it on."""
    devices: tuple[str, ...]
    """The /dev/nvidia* it holds open."""

    @property
    def identity(self) -> tuple[int, int]:
        """(pid, start ticks): a reused pid is another process, whose time in D starts anew."""
        return (self.pid, self.start_ticks)


def d_state_holders(table: ProcessTable, attribution: Attribution) -> tuple[DStateHolder, ...]:
    """The GPU holders of ``table`` that are in state D now, by pid."""
    listed: dict[int, list[tuple[int, int]]] = {}
    for ref in attribution.processes:
        if ref.verdict is ProcessVerdict.LIVE and ref.reader_pid is not None:
            listed.setdefault(ref.reader_pid, []).append((ref.gpu_index, ref.used_memory or 0))
    holders = {h.pid for h in attribution.fd_holders}
    found = []
    for proc in table:
        if proc.state != D_STATE or not (proc.pid in listed or proc.pid in holders):
            continue
        on = listed.get(proc.pid, [])
        found.append(
            DStateHolder(
                **proc.named(),
                start_ticks=proc.start_ticks,
                gpu_memory=sum(memory for _, memory in on),
                gpus=tuple(sorted({gpu for gpu, _ in on})),
                devices=proc.nvidia_fds,
            )
        )
    return tuple(sorted(found, key=lambda h: h.pid))


class DStateTracker:
    """How long each D-state GPU holder has been seen in D, across the scans given to ``update``.

    A holder keeps its first-seen time while every scan finds it in D; one that a scan does not find
    in D (it left D, exited, or its stat could not be read) starts anew, and so does a reused pid.
    The time is at scan resolution: a process that left D and came back between two scans counts
    as never having left. First-seen times are read from ``clock``, a monotonic clock: a step of the
    wall clock (NTP, an operator's ``date -s``) neither adds to nor takes from a time in D.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[tuple[int, int], float] = {}

    def update(self, holders: Iterable[DStateHolder]) -> Mapping[tuple[int, int], float]:
        """Record one scan's holders; the seconds each has been seen in D, by identity."""
        with self._lock:
            now = self._clock()
            self._since = {h.identity: self._since.get(h.identity, now) for h in holders}
            return {identity: now - since for identity, since in self._since.items()}
