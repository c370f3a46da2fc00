"""The handover verdict on the node: each GPU of a node scan judged as preflight judges it in the pod
(``verdict.judge``), for the exporter and ``top``. Apart from ``verdict`` so that preflight's fast path
imports no node code."""

from __future__ import annotations

from gpuzombie.gpu.nvml import GpuDevice
from gpuzombie.handover.verdict import GpuReading, HandoverVerdict, judge
from gpuzombie.trace.model import GpuMemory
from gpuzombie.trace.scan import NodeScan


def reading_of(device: GpuDevice) -> GpuReading:
    """What preflight reads of a GPU, from the node's NVML record of it."""
    return GpuReading(device.memory_used, device.memory_reserved, len(device.processes), device.processes_read)


def node_verdicts(scan: NodeScan) -> tuple[tuple[GpuMemory, HandoverVerdict], ...]:
    """Each GPU (or MIG instance) of the scan's trace with its verdict; where the driver reports no
    reservation, the ``--baseline-mib`` the trace used is subtracted instead."""
    return tuple(
        (memory, judge(reading_of(device), baseline_bytes=memory.baseline))
        for device, memory in zip(scan.gpus.devices, scan.trace.gpus, strict=True)
    )
