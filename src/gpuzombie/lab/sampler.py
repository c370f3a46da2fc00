"""Sample the memory a pod holds every ~10 ms in a background thread, and what that costs.

Two probes: on a GPU, NVML device used memory above the pre-pod baseline (so a leaked or ghost
context counts too) plus NVML's per-process memory of the pod's processes; on the CPU stand-in,
the RSS of the pod's worker processes (and of all its processes beside). The sampler measures its
own CPU time with ``time.thread_time`` so the report can show that sampling did not disturb the run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol, Self

from gpuzombie.gpu.nvml import NvmlBackend
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.observation import python_module
from gpuzombie.lab.runtime.pod import HOST_PROCFS, LabPod

WORKER_MODULE = "gpuzombie.workloads.worker"


@dataclass(frozen=True)
class Sample:
    t: float
    held_bytes: int
    """Memory the workload holds: GPU used above baseline, or the workers' RSS."""
    process_bytes: int
    """NVML per-process memory of the pod's processes, or the RSS of all of them."""


class Probe(Protocol):
    source: str

    def read(self) -> tuple[int, int]: ...


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` (None once it is gone): the CPU stand-in's "memory held"."""
    return HOST_PROCFS.rss_bytes(pid)


class RssProbe:
    """CPU stand-in: RSS of the pod's workers (host memory, not GPU memory)."""

    source = "RSS of the pod's processes (CPU stand-in)"

    def __init__(self, pod: LabPod) -> None:
        self.pod = pod
        self._is_worker: dict[int, bool] = {}

    def _worker(self, pid: int) -> bool:
        # Only a yes is cached: a forked child shows its parent's cmdline until it execs.
        if pid not in self._is_worker:
            argv = HOST_PROCFS.cmdline(pid)
            if argv is None:
                return False
            if (python_module(argv) or "").startswith(WORKER_MODULE):  # worker and worker_fixed
                self._is_worker[pid] = True
        return self._is_worker.get(pid, False)

    def read(self) -> tuple[int, int]:
        held = total = 0
        for pid in self.pod.tree():
            rss = rss_bytes(pid) or 0
            total += rss
            if self._worker(pid):
                held += rss
        return held, total


class NvmlProbe:
    """GPU: device used memory above the baseline taken before the pod started."""

    source = "NVML device used memory above the pre-pod baseline"

    def __init__(self, pod: LabPod, nvml: NvmlBackend, gpu_index: int, baseline_used: int) -> None:
        self.pod, self.nvml, self.gpu_index, self.baseline = pod, nvml, gpu_index, baseline_used

    def read(self) -> tuple[int, int]:
        device = self.nvml.read().device(self.gpu_index)
        if device is None:
            return 0, 0
        mine = set(self.pod.tree())
        procs = sum(p.used_memory or 0 for p in device.processes if p.pid in mine)
        return max(0, device.memory_used - self.baseline), procs


def nvml_or_standin(pod: LabPod, nvml: NvmlBackend, gpu_index: int, standin: Probe | None) -> Probe:
    """``standin`` (the CPU stand-in's RSS probe) when given; on a GPU, NVML above what the GPU used
    before the pod started. Raises LookupError when NVML shows no such GPU."""
    if standin is not None:
        return standin
    before = nvml.read()
    dev = before.device(gpu_index)
    if dev is None:
        raise LookupError(f"NVML shows no GPU {gpu_index}: {before.reason}")
    return NvmlProbe(pod, nvml, gpu_index, dev.memory_used)


class Sampler:
    """A daemon thread appending a Sample every ``interval`` seconds until ``stop()``."""

    def __init__(self, probe: Probe, events: EventLog, interval: float = 0.01) -> None:
        self.probe, self.events, self.interval = probe, events, interval
        self.samples: list[Sample] = []
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuzombie-sampler", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def _run(self) -> None:
        cpu0, wall0 = time.thread_time(), time.monotonic()
        next_at = time.monotonic()
        while not self._stop.is_set():
            held, procs = self.probe.read()
            self.samples.append(Sample(t=self.events.now(), held_bytes=held, process_bytes=procs))
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        self.cpu_seconds = time.thread_time() - cpu0
        self.wall_seconds = time.monotonic() - wall0

    @property
    def cpu_percent(self) -> float:
        """The sampler's CPU use, in percent of one core."""
        return 100.0 * self.cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0
