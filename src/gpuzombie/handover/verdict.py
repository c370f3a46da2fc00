"""The handover verdict, a pure function of what NVML says about one GPU or MIG instance.

A GPU is clean to hand out when what processes and contexts hold on it, the driver's reservation
left out, is within a small tolerance and NVML lists no process on it. Anything that could not be read
is not clean: the gate fails closed unless a team opts out of that explicitly.

The driver's reservation: NVML's v2 memory info reports it apart (an idle H200 on driver 580: v1 used
615 MiB, v2 reserved 615 MiB and used 0 MiB, DEVICE-FACTS.md). Without v2 (``reserved_bytes`` None) a
caller's measured baseline is subtracted instead.

``judge`` is total: whatever it is given (a NaN, a negative or infinite count, a reservation above
what is used, a string where a flag belongs, no reading at all) it returns a HandoverVerdict and
never raises, and a reading it cannot trust is ``unreadable``, never clean (issue 36, item 1).
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

from gpuzombie.units import MIB

DEFAULT_TOLERANCE_BYTES = 16 * MIB
"""What an idle GPU may show held without being dirty. An idle H200 shows 0 bytes held by v2 (the
reservation apart); a CUDA context alone takes about 500 MiB, so 16 MiB passes counter noise and no
real holder."""

BYTES_LIMIT = 1 << 63
"""No byte count NVML gives reaches this: its ``unsigned long long`` "not available" marker is all
bits set (``gpu.nvml.NOT_AVAILABLE_MIN``), and no GPU's memory comes near."""

CLEAN, DIRTY, UNREADABLE = "clean", "dirty", "unreadable"


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
class HandoverVerdict:
    state: str
    """``clean``; ``dirty`` (a process listed, or memory held past the tolerance: read, and not clean);
    ``unreadable`` (not read, or read as something no GPU shows: never clean)."""
    held_bytes: int
    """Memory held beyond the driver's reservation (or the given baseline); 0 when it could not be told."""
    reason: str
    """One line: why it is clean, or what makes it dirty or unreadable."""

    @property
    def clean(self) -> bool:
        return self.state == CLEAN


def byte_count(value: object) -> int | None:
    """``value`` when it is a count of bytes NVML can give (an int, not a bool, 0 ≤ value < 2**63)."""
    return value if type(value) is int and 0 <= value < BYTES_LIMIT else None


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 40


def shown(value: object) -> str:
    """A short repr of a value that could not be used (reprlib: bounded, and a failing repr is caught)."""
    return _SHOWN.repr(value)


def _unreadable(why: str) -> HandoverVerdict:
    return HandoverVerdict(UNREADABLE, 0, why)


def _impossible(reading: GpuReading) -> str | None:
    """What makes the memory of ``reading`` impossible, or None when it is a reading a GPU can give."""
    used = byte_count(reading.used_bytes)
    if used is None:
        return f"impossible reading: used memory {shown(reading.used_bytes)} is not a byte count"
    if reading.reserved_bytes is None:
        return None
    reserved = byte_count(reading.reserved_bytes)
    if reserved is None:
        return f"impossible reading: reserved memory {shown(reading.reserved_bytes)} is not a byte count"
    if reserved > used:
        return f"impossible reading: the driver's reservation ({reserved} bytes) is above what is used ({used} bytes)"
    return None


def judge(
    reading: GpuReading | None,
    *,
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
    baseline_bytes: int = 0,
    error: str | None = None,
) -> HandoverVerdict:
    """Clean, dirty or unreadable (never clean); ``error`` is why there is no ``reading``.

    A listed process is dirty whatever else the reading says (so ``--fail-open`` never passes it);
    otherwise anything not a well-formed reading is unreadable."""
    if not isinstance(reading, GpuReading):
        if reading is not None:
            why = f"not a reading: {shown(reading)}"
        else:
            why = error if isinstance(error, str) and error else "no reading" if error is None else shown(error)
        return _unreadable(f"cannot read the GPU: {why}")
    tolerance, baseline = byte_count(tolerance_bytes), byte_count(baseline_bytes)
    if tolerance is None or baseline is None:
        bad = shown(tolerance_bytes) if tolerance is None else shown(baseline_bytes)
        return _unreadable(f"cannot judge the GPU: tolerance or baseline {bad} is not a byte count")
    impossible = _impossible(reading)
    held = 0
    if impossible is None:
        base = baseline if reading.reserved_bytes is None else reading.reserved_bytes
        held = max(reading.used_bytes - base, 0)
    mib = f"{held / MIB:.0f} MiB held" if impossible is None else impossible
    listed = reading.listed_processes
    listed_ok = type(listed) is int and listed >= 0
    if listed_ok and listed > 0:
        return HandoverVerdict(DIRTY, held, f"{listed} process(es) listed, {mib}")
    if impossible is not None:
        return _unreadable(impossible)
    if held > tolerance:
        return HandoverVerdict(DIRTY, held, f"{mib} with no process listed (another namespace's or gone)")
    if not listed_ok:
        return _unreadable(f"impossible reading: listed processes {shown(listed)} is not a count")
    if reading.processes_read is not True:
        if reading.processes_read is False:
            return _unreadable("NVML would not list the processes")
        return _unreadable(f"impossible reading: processes read {shown(reading.processes_read)} is not a boolean")
    return HandoverVerdict(CLEAN, held, f"{mib}, within {tolerance / MIB:.0f} MiB")
