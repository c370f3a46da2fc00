"""Hold N MiB of memory the way a training process does, and give it back.

Three backends, chosen once per process: PyTorch when it is installed, else the CUDA driver API
through ctypes (``libcuda.so``: a GPU node needs no torch), else a CPU stand-in (anonymous memory
of the same size with every page faulted in, so it is resident). The stand-in is host memory, not GPU memory,
and says so in its ``label``: every output of the lab repeats that label.

Standard library only; torch is imported lazily.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import mmap
from collections.abc import Callable
from dataclasses import dataclass

from gpuzombie.units import MIB

DEVICES = ("auto", "cuda", "cpu")
BACKENDS = ("auto", "torch", "ctypes")
CPU_STANDIN = "cpu-standin"
CPU_STANDIN_LABEL = "CPU STAND-IN: host memory (RSS), not GPU memory; no GPU was used"


class MemoryBackendError(RuntimeError):
    """The requested device or backend cannot hold memory here."""


@dataclass
class Holding:
    """Memory held by this process until ``release()``."""

    backend: str
    """``torch``, ``ctypes`` or ``cpu-standin``."""
    device: str
    """``cuda:0`` or ``cpu``."""
    size_bytes: int
    _release: Callable[[], None]
    released: bool = False

    @property
    def label(self) -> str:
        if self.backend == CPU_STANDIN:
            return CPU_STANDIN_LABEL
        return f"GPU memory on {self.device} through {self.backend}"

    def release(self) -> None:
        """Free the memory (idempotent): what a graceful SIGTERM handler does."""
        if not self.released:
            self._release()
            self.released = True


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def cuda_present() -> bool:
    """True when the CUDA driver can be loaded and reports at least one device."""
    try:
        lib = _libcuda()
    except MemoryBackendError:
        return False
    count = ctypes.c_int(0)
    return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu``."""
    if device not in DEVICES:
        raise MemoryBackendError(f"unknown device {device!r} (one of {', '.join(DEVICES)})")
    if device == "auto":
        return "cuda" if cuda_present() else "cpu"
    return device


def resolve_backend(device: str, backend: str) -> str:
    """The backend that will hold the memory: ``cpu-standin`` for the CPU whatever was asked."""
    if backend not in BACKENDS:
        raise MemoryBackendError(f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    if resolve_device(device) == "cpu":
        return CPU_STANDIN
    if backend == "auto":
        return "torch" if torch_installed() else "ctypes"
    return backend


def hold(size_mib: int, *, device: str = "auto", backend: str = "auto", gpu_index: int = 0) -> Holding:
    """Allocate and touch ``size_mib`` MiB on the chosen device; raises MemoryBackendError."""
    size = int(size_mib) * MIB
    chosen = resolve_backend(device, backend)
    if chosen == CPU_STANDIN:
        return _hold_cpu(size)
    if chosen == "torch":
        return _hold_torch(size, gpu_index)
    return _hold_ctypes(size, gpu_index)


def _hold_cpu(size: int) -> Holding:
    # An anonymous mapping rather than a bytearray: munmap hands the pages back to the kernel at
    # once, so a graceful release shows in RSS the way cudaFree shows in NVML. MAP_POPULATE
    # faults every page in inside the kernel (half the time of touching them from Python); the
    # touch loop is the fallback where MAP_POPULATE is missing.
    populate = getattr(mmap, "MAP_POPULATE", 0)
    mapping = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    if not populate:
        for offset in range(0, size, mmap.PAGESIZE):
            mapping[offset] = 1
    buf: mmap.mmap | None = mapping

    def release() -> None:
        nonlocal buf
        if buf is not None:
            buf.close()
            buf = None

    return Holding(backend=CPU_STANDIN, device="cpu", size_bytes=size, _release=release)


def _hold_torch(size: int, gpu_index: int) -> Holding:
    import torch  # lazy: the image may not have it

    if not torch.cuda.is_available():
        raise MemoryBackendError("torch is installed but sees no CUDA device")
    dev = torch.device("cuda", gpu_index)
    tensors = [torch.empty(size, dtype=torch.uint8, device=dev)]
    tensors[0].fill_(1)
    torch.cuda.synchronize(dev)

    def release() -> None:
        tensors.clear()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()

    return Holding(backend="torch", device=f"cuda:{gpu_index}", size_bytes=size, _release=release)


def _libcuda() -> ctypes.CDLL:
    for name in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise MemoryBackendError("libcuda.so (the CUDA driver) is not installed")


def _check(lib: ctypes.CDLL, result: int, call: str) -> None:
    if result != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(result, ctypes.byref(text))
        detail = text.value.decode() if text.value else "unknown error"
        raise MemoryBackendError(f"{call} failed: CUDA error {result} ({detail})")


def _hold_ctypes(size: int, gpu_index: int) -> Holding:
    """The CUDA driver API directly: primary context, cuMemAlloc, cuMemsetD8 (pages really used)."""
    lib = _libcuda()
    _check(lib, lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), gpu_index), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    _check(lib, lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
    _check(lib, lib.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), ctypes.c_size_t(size)), "cuMemsetD8")
    _check(lib, lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def release() -> None:
        _check(lib, lib.cuMemFree_v2(ptr), "cuMemFree")
        _check(lib, lib.cuDevicePrimaryCtxRelease_v2(dev), "cuDevicePrimaryCtxRelease")

    return Holding(backend="ctypes", device=f"cuda:{gpu_index}", size_bytes=size, _release=release)
