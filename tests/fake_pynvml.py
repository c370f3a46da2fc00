"""A stand-in for nvidia-ml-py's ``pynvml`` module, for the MIG paths no GPU here can show.

Named as a stand-in: only the functions ``gpuzombie.gpu.nvml`` calls, under nvidia-ml-py's own names
and signatures, over a described machine. What it returns and raises is nvidia-ml-py's own: its
``NVMLError`` (the subclass for each NVML error code, ``.value`` the code), its ctypes memory
structs (``c_nvmlMemory_t``, ``c_nvmlMemory_v2_t``), its process-info struct turned into the object
its ``nvmlDeviceGetComputeRunningProcesses`` returns (``nvmlStructToFriendlyObject``), and its
``c_nvmlDeviceAttributes``. NVML's documented MIG behaviour is modelled: with MIG mode on, the whole
GPU's processes are listed only to a privileged caller (``privileged``), each MIG device handle lists
its own; ``nvmlDeviceGetMigDeviceHandleByIndex`` raises NOT_FOUND for an empty slot; a GPU without
MIG raises NOT_SUPPORTED from ``nvmlDeviceGetMigMode``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pynvml

MIB = 1024 * 1024


@dataclass
class Memory:
    total: int
    used: int
    reserved: int = 0

    def struct(self, version: int | None) -> object:
        free = self.total - self.used
        if version:
            return pynvml.c_nvmlMemory_v2_t(version, self.total, self.reserved, free, self.used - self.reserved)
        return pynvml.c_nvmlMemory_t(self.total, free, self.used)


@dataclass
class MigDevice:
    """One MIG device (a compute instance of a GPU instance)."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    name: str  # "NVIDIA H200 MIG 1g.18gb", as NVML names a MIG device
    memory: Memory
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    slices: int = 1


@dataclass
class Gpu:
    uuid: str
    name: str
    memory: Memory
    processes: list[tuple[int, int]] = field(default_factory=list)
    mig_mode: int | None = None  # None: no MIG (NOT_SUPPORTED); else NVML_DEVICE_MIG_ENABLE/DISABLE
    slots: list[MigDevice | None] = field(default_factory=list)  # nvmlDeviceGetMaxMigDeviceCount slots
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code it raises


@dataclass(frozen=True)
class _Handle:
    gpu: Gpu
    mig: MigDevice | None = None


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


def module(gpus: list[Gpu], *, privileged: bool = False, names: dict[int, str] | None = None) -> types.ModuleType:
    """A ``pynvml`` stand-in over ``gpus`` (``names``: pid -> nvmlSystemGetProcessName)."""
    nv = types.ModuleType("pynvml_standin")
    for name in dir(pynvml):  # the constants and the error classes, as nvidia-ml-py defines them
        if name.startswith(("NVML_", "NVMLError")) or name == "nvmlMemory_v2":
            setattr(nv, name, getattr(pynvml, name))

    def check(fn: str, handle: _Handle | None = None) -> None:
        if handle is not None and fn in handle.gpu.fail:
            _raise(handle.gpu.fail[fn])

    def processes(handle: _Handle, fn: str) -> list[object]:
        check(fn, handle)
        if fn == "nvmlDeviceGetGraphicsRunningProcesses":
            return []
        if handle.mig is not None:
            listed = [(pid, used, handle.mig) for pid, used in handle.mig.processes]
        elif handle.gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE:
            if not privileged:
                return []  # NVML: aggregate information only to a caller with privileges
            listed = [(pid, used, m) for m in handle.gpu.slots if m for pid, used in m.processes]
        else:
            listed = [(pid, used, None) for pid, used in handle.gpu.processes]
        out = []
        for pid, used, mig in listed:
            gi = mig.gpu_instance_id if mig else 0xFFFFFFFF
            ci = mig.compute_instance_id if mig else 0xFFFFFFFF
            out.append(pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(pid, used, gi, ci)))
        return out

    def get_mig(handle: _Handle) -> MigDevice:
        if handle.mig is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert handle.mig is not None
        return handle.mig

    def memory_info(handle: _Handle, version: int | None = None) -> object:
        check("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig is not None:
            return handle.mig.memory.struct(version)
        return handle.gpu.memory.struct(version)

    def mig_mode(handle: _Handle) -> list[int]:
        if handle.gpu.mig_mode is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [handle.gpu.mig_mode, handle.gpu.mig_mode]

    def mig_handle(handle: _Handle, index: int) -> _Handle:
        check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(handle.gpu.slots):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = handle.gpu.slots[index]
        if found is None:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, found)

    def attributes(handle: _Handle) -> object:
        mig = get_mig(handle)
        return pynvml.c_nvmlDeviceAttributes(
            gpuInstanceSliceCount=mig.slices, computeInstanceSliceCount=mig.slices, memorySizeMB=mig.memory.total // MIB
        )

    functions = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlSystemGetProcessName": lambda pid: (names or {}).get(pid) or _raise(pynvml.NVML_ERROR_NOT_FOUND),
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: _Handle(gpus[i]),
        "nvmlDeviceGetUUID": lambda h: h.mig.uuid if h.mig else h.gpu.uuid,
        "nvmlDeviceGetName": lambda h: h.mig.name if h.mig else h.gpu.name,
        "nvmlDeviceGetMinorNumber": lambda h: (
            gpus.index(h.gpu) if h.mig is None else _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ),
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: processes(h, "nvmlDeviceGetComputeRunningProcesses"),
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: processes(h, "nvmlDeviceGetGraphicsRunningProcesses"),
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: len(h.gpu.slots),
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda h: get_mig(h).gpu_instance_id,
        "nvmlDeviceGetComputeInstanceId": lambda h: get_mig(h).compute_instance_id,
        "nvmlDeviceGetAttributes": attributes,
    }
    for name, fn in functions.items():
        assert hasattr(pynvml, name), f"nvidia-ml-py has no {name}: the stand-in must use its names"
        setattr(nv, name, fn)
    return nv
