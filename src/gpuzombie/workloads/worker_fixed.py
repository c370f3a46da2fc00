"""The original experiment's ``gpu_worker_fixed.py``: hold memory, and on SIGTERM free it and exit (scenario 4).

    python3 -m gpuzombie.workloads.worker_fixed [--size-mib M] [--device ...] [--backend ...]

The handler only records the signal; the main loop does the work (clear the tensors,
``empty_cache``, ``destroy_process_group`` when a process group exists) and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from gpuzombie.workloads.worker import start_holding


def destroy_process_group() -> bool:
    """``torch.distributed.destroy_process_group()`` when torch is loaded and a group exists."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    stopping: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    holding = start_holding(argv, "gpuzombie.workloads.worker_fixed", "Hold memory; on SIGTERM free it and exit.")
    while not stopping:
        signal.pause()  # returns after the handler ran
    holding.release()
    destroyed = destroy_process_group()
    # stderr: the parent that read our stdout is gone; stderr is the pod's log.
    print(f"released pid={os.getpid()} process-group-destroyed={destroyed}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    # Leave at once: the memory is already freed, and the interpreter's teardown (torch's atexit
    # hooks, module cleanup) would only keep the CUDA context (~500 MiB) alive longer; the driver
    # frees the context when the process ends either way.
    sys.stdout.flush()
    os._exit(status)
