"""The handover verdict, a pure function of what NVML says about one GPU or MIG instance.

A GPU is clean to hand out when what processes and contexts hold on it, the driver's reservation
left out, is within a small tolerance and NVML lists no process on it. Anything that could not be read
is not clean: the gate fails closed unless a team opts out of that explicitly.

The driver's reservation: NVML's v2 memory info reports it apart (an idle H200 on driver 580: v1 used
615 MiB, v2 reserved 615 MiB and used 0 MiB, DEVICE-FACTS.md). Without v2 (``reserved_bytes`` None) a
caller's measured baseline is subtracted instead.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20

DEFAULT_TOLERANCE_BYTES = 16 * MIB
"""What an idle GPU may show held without being dirty. An idle H200 shows 0 bytes held by v2 (the
reservation apart); a CUDA context alone takes about 500 MiB, so 16 MiB passes counter noise and no
real holder."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU (or MIG instance) as NVML showed it; bytes throughout."""

    used_bytes: int
    """total − free, as NVML's v1 memory info gives it (the driver's reservation included)."""
    reserved_bytes: int | None
    """The driver's reservation from NVML's v2 memory info; None when the driver does not report it."""
    listed_processes: int
    """Processes NVML lists on it (from a container: only the container's own PID namespace's)."""
    processes_read: bool = True
    """False when NVML would not list processes: then an empty list proves nothing."""


@dataclass(frozen=True)
class Verdict:
    clean: bool
    held_bytes: int
    """Memory held beyond the driver's reservation (or the given baseline)."""
    reason: str
    """One line: why it is clean, or what makes it dirty or unreadable."""


def judge(
    reading: GpuReading | None,
    *,
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
    baseline_bytes: int = 0,
    error: str | None = None,
) -> Verdict:
    """Clean, dirty or unreadable (never clean); ``error`` is why there is no ``reading``."""
    if reading is None:
        return Verdict(False, 0, f"cannot read the GPU: {error or 'no reading'}")
    base = reading.reserved_bytes if reading.reserved_bytes is not None else baseline_bytes
    held = max(reading.used_bytes - base, 0)
    mib = held / MIB
    if reading.listed_processes:
        return Verdict(False, held, f"{reading.listed_processes} process(es) listed, {mib:.0f} MiB held")
    if held > tolerance_bytes:
        return Verdict(False, held, f"{mib:.0f} MiB held with no process listed (another namespace's or gone)")
    if not reading.processes_read:
        return Verdict(False, held, "NVML would not list the processes")
    return Verdict(True, held, f"{mib:.0f} MiB held, within {tolerance_bytes / MIB:.0f} MiB")
