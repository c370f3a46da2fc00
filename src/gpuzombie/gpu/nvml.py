"""The one NVML boundary: the only module that imports ``pynvml`` (from the nvidia-ml-py package).

No library, no driver and no GPU are normal states: ``read()`` then returns a snapshot with
``available=False`` and a one-line ``reason``, never an exception. Which pids NVML reports depends on
the driver and on the caller's PID namespace (host pids, or the caller's own namespace's pids with
other namespaces' processes left out), so the pids here are "as NVML gave them"; mapping them to
processes is the job of ``gpuzombie.gpu.attribution``.
"""

from __future__ import annotations

import math
import re
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
class MigInstance:
    """One MIG GPU instance, read through NVML's MIG device handles: its memory and processes are its
    own, so the ghost arithmetic is done per instance. Named as dcgm-exporter names it."""

    gpu_instance_id: int
    """dcgm-exporter's ``GPU_I_ID`` (NVML's GPU instance id)."""
    profile: str
    """dcgm-exporter's ``GPU_I_PROFILE``: ``1g.18gb``, ``3g.71gb``, ..."""
    compute_instance_ids: tuple[int, ...]
    uuids: tuple[str, ...]
    """``MIG-…`` of its MIG devices (one per compute instance): the ids PodResources assigns."""
    slots: tuple[int, ...] = ()
    """The index of each of its MIG devices among the GPU's MIG device handles
    (``nvmlDeviceGetMigDeviceHandleByIndex``), in ``uuids``' order: the ``j`` of the device plugin's
    index ids ``i:j``."""


@dataclass(frozen=True)
class GpuDevice:
    """A GPU, or with MIG mode on one GPU instance of it (``mig``): then ``index``, ``uuid``, ``name``
    and ``device_node`` are the parent GPU's, as in dcgm-exporter's series, and memory and processes
    the instance's."""

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
    mig_mode: bool = False
    """MIG mode is on for the (parent) GPU."""
    mig: MigInstance | None = None
    """The GPU instance this entry is; None for a whole GPU (with ``mig_mode``: one whose instances
    could not be read, whose process list proves nothing)."""
    processes_read: bool = True
    """False when NVML would not list the processes: an empty ``processes`` is then unknown."""

    @property
    def device_node(self) -> str:
        return f"/dev/nvidia{self.index if self.minor_number is None else self.minor_number}"

    @property
    def process_memory(self) -> int:
        """Σ memory of the listed processes (unknown amounts count as 0)."""
        return sum(p.used_memory or 0 for p in self.processes)


@dataclass(frozen=True)
class GpuStatus:
    """Whether NVML answered (why not, else the driver): what a report says of the GPUs before any device."""

    available: bool
    reason: str | None = None
    driver_version: str | None = None


@dataclass(frozen=True)
class GpuSnapshot(GpuStatus):
    cuda_driver_version: int | None = None
    devices: tuple[GpuDevice, ...] = field(default_factory=tuple)

    @property
    def status(self) -> GpuStatus:
        """The status alone, no devices (the trace's ``gpu``)."""
        return GpuStatus(self.available, self.reason, self.driver_version)

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
            GpuDevice(
                **{
                    **d,
                    "processes": tuple(GpuProcess(**p) for p in d.get("processes", ())),
                    "mig": _mig_from_dict(d.get("mig")),
                }
            )
            for d in data.get("devices", ())
        )
        return cls(GpuSnapshot(**{**data, "devices": devices}))


def _mig_from_dict(data: dict[str, Any] | None) -> MigInstance | None:
    if data is None:
        return None
    return MigInstance(
        gpu_instance_id=data["gpu_instance_id"],
        profile=data["profile"],
        compute_instance_ids=tuple(data.get("compute_instance_ids", ())),
        uuids=tuple(data.get("uuids", ())),
        slots=tuple(data.get("slots", ())),
    )


NO_GPU = GpuSnapshot(available=False, reason="no NVML backend")


class PynvmlBackend:
    """The real NVML through nvidia-ml-py, initialised lazily once under a lock."""

    _lock = threading.Lock()

    def __init__(self, module: Any = None) -> None:
        self._module = module  # pynvml itself, or a stand-in with its names (tests)
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
                if self._module is not None:
                    pynvml = self._module
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
            devices = tuple(d for i in range(count) for d in self._read_gpu(nv, i))
            driver = _text(nv.nvmlSystemGetDriverVersion())
            cuda = _optional(nv, nv.nvmlSystemGetCudaDriverVersion)
        except (nv.NVMLError, OSError, AttributeError) as exc:
            # AttributeError: an nvidia-ml-py older than the function or constant we asked for.
            return GpuSnapshot(available=False, reason=f"NVML query failed: {type(exc).__name__}: {exc}")
        return GpuSnapshot(available=True, driver_version=driver, cuda_driver_version=cuda, devices=devices)

    def _read_gpu(self, nv: Any, index: int) -> tuple[GpuDevice, ...]:
        """The GPU, or with MIG mode on each of its GPU instances (the whole GPU when none can be read)."""
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        gpu: dict[str, Any] = {
            "index": index,
            "uuid": _text(nv.nvmlDeviceGetUUID(handle)),
            "name": _text(nv.nvmlDeviceGetName(handle)),
            "minor_number": _optional(nv, nv.nvmlDeviceGetMinorNumber, handle),
        }
        if not _mig_enabled(nv, handle):
            processes, read = _processes(nv, handle)
            return (GpuDevice(**gpu, **_memory(nv, handle), processes=processes, processes_read=read),)
        # In MIG mode NVML gives the whole GPU's processes (and memory) only to a privileged caller:
        # each GPU instance is read through its own MIG device handles.
        try:
            instances = _mig_instances(nv, handle, gpu)
        except nv.NVMLError:
            instances = ()
        return instances or (GpuDevice(**gpu, **_memory(nv, handle), mig_mode=True, processes_read=False),)


def _memory(nv: Any, handle: Any) -> dict[str, Any]:
    """total, used, free and the driver's reservation of a device or MIG device handle, in bytes."""
    # v2 splits the driver's reservation out of "used" (H200, driver 580: idle v1 used 615 MiB =
    # v2 used 0 + reserved 615). We keep "used" in v1's sense, total - free, and report reserved
    # beside it, so ghost = used - reserved - Σ process memory holds with either version.
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        reserved: int | None = int(mem.reserved)
    except (nv.NVMLError, AttributeError):
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        reserved = None
    return {
        "memory_total": int(mem.total),
        "memory_used": int(mem.total) - int(mem.free),
        "memory_free": int(mem.free),
        "memory_reserved": reserved,
    }


def _processes(nv: Any, handle: Any) -> tuple[tuple[GpuProcess, ...], bool]:
    """The compute and graphics processes of a handle, and whether the compute list could be read
    (graphics lists are refused on compute-only GPUs, which says nothing)."""
    processes = []
    read = True
    for kind, getter in (
        ("compute", nv.nvmlDeviceGetComputeRunningProcesses),
        ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
    ):
        try:
            listed = getter(handle)
        except nv.NVMLError:
            read = read and kind != "compute"
            continue
        for p in listed:
            processes.append(
                GpuProcess(
                    pid=int(p.pid),
                    used_memory=_known_memory(p.usedGpuMemory),
                    kind=kind,
                    name=_optional(nv, lambda pid=p.pid: _text(nv.nvmlSystemGetProcessName(pid))),
                )
            )
    return tuple(processes), read


def _mig_enabled(nv: Any, handle: Any) -> bool:
    """MIG mode is on now (not only pending); False where the GPU or the binding has no MIG."""
    get_mode = getattr(nv, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return False
    mode = _optional(nv, get_mode, handle)  # [current, pending]; NOT_SUPPORTED without MIG
    return mode is not None and mode[0] == nv.NVML_DEVICE_MIG_ENABLE


def _mig_instances(nv: Any, handle: Any, gpu: dict[str, Any]) -> tuple[GpuDevice, ...]:
    """One entry per GPU instance: its memory (that of its first MIG device: all of a GPU instance's
    compute instances share it) and the processes of all its MIG devices, once each."""
    by_instance: dict[int, list[tuple[int, int, Any]]] = {}
    for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_NOT_FOUND:  # an empty slot: the maximum is not the count
                continue
            raise
        gi = nv.nvmlDeviceGetGpuInstanceId(mig)
        by_instance.setdefault(gi, []).append((nv.nvmlDeviceGetComputeInstanceId(mig), slot, mig))
    found = []
    for gi, members in sorted(by_instance.items()):
        members.sort(key=lambda m: m[0])
        first = members[0][2]
        processes: dict[tuple[int, str], GpuProcess] = {}
        read = True
        for _, _, mig in members:
            listed, ok = _processes(nv, mig)
            read = read and ok
            for p in listed:
                processes.setdefault((p.pid, p.kind), p)
        instance = MigInstance(
            gpu_instance_id=gi,
            profile=_mig_profile(nv, first),
            compute_instance_ids=tuple(ci for ci, _, _ in members),
            uuids=tuple(_text(nv.nvmlDeviceGetUUID(mig)) for _, _, mig in members),
            slots=tuple(slot for _, slot, _ in members),
        )
        found.append(
            GpuDevice(
                **gpu,
                **_memory(nv, first),
                processes=tuple(processes.values()),
                mig_mode=True,
                mig=instance,
                processes_read=read,
            )
        )
    return tuple(found)


_PROFILE_IN_NAME = re.compile(r"\bMIG (?:\d+c\.)?(\d+g\.\d+gb\S*)$")
"""The GPU instance profile at the end of a MIG device's name ("NVIDIA H200 MIG 1g.18gb"; a compute
instance smaller than its GPU instance: "... MIG 1c.2g.35gb", whose GPU instance is 2g.35gb)."""


def _mig_profile(nv: Any, mig: Any) -> str:
    """The GPU instance profile as dcgm-exporter labels it (GPU_I_PROFILE): from the MIG device's name,
    else from its slice count and memory size."""
    match = _PROFILE_IN_NAME.search(_text(nv.nvmlDeviceGetName(mig)))
    if match:
        return match.group(1)
    attributes = nv.nvmlDeviceGetAttributes(mig)
    return f"{attributes.gpuInstanceSliceCount}g.{math.ceil(attributes.memorySizeMB / 1024)}gb"


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
