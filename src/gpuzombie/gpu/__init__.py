"""NVML (the only place pynvml is imported) and the attribution of GPU memory to processes."""

from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuProcess, GpuSnapshot, NvmlBackend, PynvmlBackend

__all__ = ["FakeNvml", "GpuDevice", "GpuProcess", "GpuSnapshot", "NvmlBackend", "PynvmlBackend"]
