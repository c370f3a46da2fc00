"""Run the real ``gpuzombie`` CLI (``preflight``) in this process with NVML replaced by
tests/fake_pynvml.py (nvidia-ml-py's own structs and errors), whose memory read takes DELAY seconds:
a slow or hung driver, for the deadline tests of tests/test_preflight_hostile.py.

    python tests/preflight_nvml_driver.py DELAY GRACE [preflight flags...]

GRACE replaces ``preflight.READ_GRACE_S`` (how long a read begun before the deadline may run past it).
"""

from __future__ import annotations

import sys
import time

import fake_pynvml as nv
import gpuzombie.gpu.nvml as nvml
from gpuzombie.cli.main import main
from gpuzombie.handover import preflight

MIB = 1 << 20
UUID = "GPU-5104-0000-0000-0000-000000000001"


def slow_module(delay_s: float) -> object:
    """One H200 with 2048 MiB held by no listed process (dirty), read in ``delay_s`` seconds."""
    gpu = nv.Gpu(UUID, "NVIDIA H200", nv.Memory(143771 * MIB, (615 + 2048) * MIB, 615 * MIB))
    module = nv.module([gpu])
    fast = module.nvmlDeviceGetMemoryInfo

    def slow(*args: object, **kwargs: object) -> object:
        print("preflight-nvml-driver: reading", file=sys.stderr, flush=True)
        time.sleep(delay_s)
        return fast(*args, **kwargs)

    module.nvmlDeviceGetMemoryInfo = slow
    return module


if __name__ == "__main__":
    delay, grace, *flags = sys.argv[1:]
    module = slow_module(float(delay))
    nvml.default_backend = lambda: nvml.PynvmlBackend(module)
    preflight.READ_GRACE_S = float(grace)
    sys.exit(main(["preflight", *flags]))
