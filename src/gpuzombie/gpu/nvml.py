"""The one NVML boundary: the only module that imports ``pynvml`` (from the nvidia-ml-py package).

No library, no driver and no GPU are normal states: ``read()`` then returns a snapshot with
``available=False`` and a one-line ``reason``, never an exception. Which pids NVML reports depends on
the driver and on the caller's PID namespace (host pids, or the caller's own namespace's pids with
other namespaces' processes left out), so the pids here are "as NVML gave them"; mapping them to
processes is the job of ``gpuzombie.gpu.attribution``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists on a device, with the pid exactly as NVML reported it."""

    pid: int
    used_memory: int | None
    kind: str  # "compute" or "graphics"
    name: str | None = None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int  # total - free: includes the driver's reservation
    memory_free: int
    memory_reserved: int | None
    processes: tuple[GpuProcess, ...] = ()
    minor_number: int | None = None
    """N of the device node /dev/nvidiaN (usually, not always, the index)."""

    @property
    def device_node(self) -> str:
        return f"/dev/nvidia{self.index if self.minor_number is None else self.minor_number}"

    @property
    def process_memory(self) -> int:
        """Σ memory of the listed processes (unknown amounts count as 0)."""
        return sum(p.used_memory or 0 for p in self.processes)


@dataclass(frozen=True)
class GpuSnapshot:
    available: bool
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    devices: tuple[GpuDevice, ...] = field(default_factory=tuple)

    def device(self, index: int) -> GpuDevice | None:
        return next((d for d in self.devices if d.index == index), None)


class NvmlBackend(Protocol):
    """Anything that can produce a GpuSnapshot: the real NVML, or a fake in tests."""

    def read(self) -> GpuSnapshot: ...


@dataclass
class FakeNvml:
    """A backend that returns a fixed snapshot; for tests and for replaying recorded state."""

    snapshot: GpuSnapshot

    def read(self) -> GpuSnapshot:
        return self.snapshot

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FakeNvml:
        """A snapshot recorded as JSON (``dataclasses.asdict`` of a GpuSnapshot, memory in bytes)."""
        devices = tuple(
            GpuDevice(**{**d, "processes": tuple(GpuProcess(**p) for p in d.get("processes", ()))})
            for d in data.get("devices", ())
        )
        return cls(GpuSnapshot(**{**data, "devices": devices}))


NO_GPU = GpuSnapshot(available=False, reason="no NVML backend")


class PynvmlBackend:
    """The real NVML through nvidia-ml-py, initialised lazily once under a lock."""

    _lock = threading.Lock()

    def __init__(self) -> None:
        self._pynvml: Any = None
        self._init_error: str | None = None

    def _ensure_init(self) -> Any:
        with self._lock:
            if self._pynvml is None and self._init_error is None:
                try:
                    import pynvml
                except ImportError:
                    self._init_error = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
                    return None
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError as exc:
                    self._init_error = f"NVML unavailable: {exc}"
                    return None
                except OSError as exc:  # a broken libnvidia-ml.so
                    self._init_error = f"NVML unavailable: {exc}"
                    return None
                self._pynvml = pynvml
            return self._pynvml

    def read(self) -> GpuSnapshot:
        nv = self._ensure_init()
        if nv is None:
            return GpuSnapshot(available=False, reason=self._init_error)
        try:
            count = nv.nvmlDeviceGetCount()
            devices = tuple(self._read_device(nv, i) for i in range(count))
            driver = _text(nv.nvmlSystemGetDriverVersion())
            cuda = _optional(nv, nv.nvmlSystemGetCudaDriverVersion)
        except (nv.NVMLError, OSError, AttributeError) as exc:
            # AttributeError: an nvidia-ml-py older than the function or constant we asked for.
            return GpuSnapshot(available=False, reason=f"NVML query failed: {type(exc).__name__}: {exc}")
        return GpuSnapshot(available=True, driver_version=driver, cuda_driver_version=cuda, devices=devices)

    def _read_device(self, nv: Any, index: int) -> GpuDevice:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        # v2 splits the driver's reservation out of "used" (H200, driver 580: idle v1 used 615 MiB =
        # v2 used 0 + reserved 615). We keep "used" in v1's sense, total - free, and report reserved
        # beside it, so ghost = used - reserved - Σ process memory holds with either version.
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            reserved: int | None = int(mem.reserved)
        except (nv.NVMLError, AttributeError):
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        processes = []
        for kind, getter in (
            ("compute", nv.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for p in _optional(nv, getter, handle) or ():
                used = p.usedGpuMemory
                processes.append(
                    GpuProcess(
                        pid=int(p.pid),
                        used_memory=_known_memory(used),
                        kind=kind,
                        name=_optional(nv, lambda pid=p.pid: _text(nv.nvmlSystemGetProcessName(pid))),
                    )
                )
        return GpuDevice(
            index=index,
            uuid=_text(nv.nvmlDeviceGetUUID(handle)),
            name=_text(nv.nvmlDeviceGetName(handle)),
            memory_total=int(mem.total),
            memory_used=int(mem.total) - int(mem.free),
            memory_free=int(mem.free),
            memory_reserved=reserved,
            processes=tuple(processes),
            minor_number=_optional(nv, nv.nvmlDeviceGetMinorNumber, handle),
        )


NOT_AVAILABLE_MIN = 1 << 63
"""NVML marks an unknown amount with all bits set (NVML_VALUE_NOT_AVAILABLE_ulonglong); pynvml versions
differ in whether they turn it into None, so both are accepted."""


def _known_memory(used: int | None) -> int | None:
    return None if used is None or used >= NOT_AVAILABLE_MIN else int(used)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional(nv: Any, fn: Any, *args: Any) -> Any:
    """Call an NVML function that a driver may lack or refuse; None instead of an exception."""
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def default_backend() -> NvmlBackend:
    return PynvmlBackend()


def read_gpus(backend: NvmlBackend) -> GpuSnapshot:
    """``backend.read()``, with any failure turned into an unavailable snapshot: a driver or binding
    bug must not hide the process findings of observe and trace, which stand without NVML."""
    try:
        return backend.read()
    except Exception as exc:  # noqa: BLE001 - any exception: the report goes on without GPUs
        return GpuSnapshot(available=False, reason=f"NVML failed: {type(exc).__name__}: {exc}")
