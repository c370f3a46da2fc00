"""GPU memory over time, every GPU and every rank: NVML on a GPU, the ranks' RSS on the stand-in.

Per GPU it keeps used memory and the *unexplained* part (used − driver reservation − Σ listed
processes): after rank 0 dies, the survivor's peer context on rank 0's GPU is unexplained memory
that no process is listed for (DEVICE-FACTS: ~291 MiB on H200).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuzombie.gpu.nvml import NvmlBackend
from gpuzombie.lab.sampler import rss_bytes
from gpuzombie.lab.series import settled_from, value_at
from gpuzombie.units import MIB


@dataclass(frozen=True)
class GpuPoint:
    index: int
    used_mib: float
    unexplained_mib: float


@dataclass(frozen=True)
class MemorySample:
    t: float
    gpus: tuple[GpuPoint, ...]
    by_pid: dict[int, float]
    """MiB per pid: NVML's per-process memory summed over GPUs, or RSS on the stand-in."""


class MemorySampler:
    def __init__(
        self,
        *,
        nvml: NvmlBackend | None,
        pids: Callable[[], list[int]],
        clock: Callable[[], float],
        interval_s: float = 0.1,
    ) -> None:
        self.nvml = nvml
        self.pids = pids
        self.clock = clock
        self.interval_s = interval_s
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nccl-memory-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; safe before ``start()`` (an interrupted start-up still cleans up)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sample(self) -> MemorySample:
        t = self.clock()
        gpus: list[GpuPoint] = []
        by_pid: dict[int, float] = {}
        if self.nvml is not None:
            snap = self.nvml.read()
            for d in snap.devices:
                reserved = d.memory_reserved or 0
                gpus.append(
                    GpuPoint(
                        d.index,
                        round(d.memory_used / MIB, 1),
                        round(max(0, d.memory_used - reserved - d.process_memory) / MIB, 1),
                    )
                )
                for p in d.processes:
                    by_pid[p.pid] = by_pid.get(p.pid, 0.0) + (p.used_memory or 0) / MIB
        else:
            for pid in self.pids():
                rss = rss_bytes(pid)
                if rss is not None:
                    by_pid[pid] = rss / MIB
        return MemorySample(t=t, gpus=tuple(gpus), by_pid={k: round(v, 1) for k, v in by_pid.items()})

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception:  # noqa: BLE001
                pass  # one bad read (a process vanishing mid-query) is no reason to stop sampling
            self._stop.wait(self.interval_s)


def freed_at(samples: list[MemorySample], pid: int, after: float) -> float | None:
    """First time ≥ ``after`` from which ``pid`` holds no memory in any later sample."""
    return settled_from(samples, after, lambda s: s.by_pid.get(pid, 0.0) <= 0.0)


def held_before(samples: list[MemorySample], pid: int, t: float) -> float:
    """MiB ``pid`` held in the last sample at or before ``t`` that lists it (0 if none does)."""
    return value_at(samples, t, lambda s: s.by_pid.get(pid), 0.0)


def unexplained_at(samples: list[MemorySample], gpu: int, t: float) -> float | None:
    """Unexplained MiB on ``gpu`` in the last sample at or before ``t``."""
    return value_at(samples, t, lambda s: next((g.unexplained_mib for g in s.gpus if g.index == gpu), None), None)
