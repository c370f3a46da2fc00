"""NVML's records for tests and benchmarks, built by keyword: a device says what differs from an
H200 whose memory is all accounted for (the driver's reservation plus its processes), instead of
seven positional fields."""

from __future__ import annotations

from collections.abc import Iterable

from gpuzombie.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.units import MIB

H200_MEMORY = 140 * 1024 * MIB
DRIVER_RESERVED = 615 * MIB  # what an idle H200 shows used under driver 580.159


def gpu_process(pid: int, *, mib: int = 2658, name: str | None = "python3", kind: str = "compute") -> GpuProcess:
    """A process NVML lists on a device (2658 MiB: the original experiment's worker)."""
    return GpuProcess(pid=pid, used_memory=mib * MIB, kind=kind, name=name)


def gpu_device(
    index: int = 0,
    *,
    processes: Iterable[GpuProcess] = (),
    used: int | None = None,
    free: int | None = None,
    total: int = H200_MEMORY,
    reserved: int | None = DRIVER_RESERVED,
    uuid: str | None = None,
    name: str = "NVIDIA H200",
) -> GpuDevice:
    """A device; ``used`` defaults to the reservation plus its processes' memory (give more to
    model memory nobody accounts for), ``free`` to ``total - used``, ``uuid`` to ``GPU-<index>``."""
    processes = tuple(processes)
    if used is None:
        used = (reserved or 0) + sum(p.used_memory or 0 for p in processes)
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index}" if uuid is None else uuid,
        name=name,
        memory_total=total,
        memory_used=used,
        memory_free=total - used if free is None else free,
        memory_reserved=reserved,
        processes=processes,
    )


def gpu_snapshot(
    *devices: GpuDevice, driver_version: str | None = None, cuda_driver_version: int | None = None
) -> GpuSnapshot:
    """What NVML reports on a node with these devices."""
    return GpuSnapshot(
        available=True, driver_version=driver_version, cuda_driver_version=cuda_driver_version, devices=devices
    )
