"""``gpuzombie.graceful``'s kernel backstop on a real CUDA process: its memory is freed at the deadline.

The worker holds 1 GiB through torch, handles SIGALRM itself (the case that had no backstop), and
its ``on_stop`` callback holds the GIL for 60 s (a ctypes.PyDLL call): the watchdog thread cannot
run, so only the guard's kernel timer (SIGKILL, 1 s after the 1 s deadline) can end it. NVML is
read every 10 ms: the worker must be gone from its list soon after the SIGKILL.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time

from gpupods import GPU_TEST, PY, environ, nvml_pids, save
from gpuzombie.graceful.guard import BACKSTOP_GRACE_S
from pidns import wait_until

pytestmark = GPU_TEST
SIZE_MIB = 1024
DEADLINE_S = 1.0

WORKER = f"""
import ctypes, signal, time
import torch
from gpuzombie import graceful
held = torch.empty({SIZE_MIB} << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
signal.signal(signal.SIGALRM, lambda *a: None)  # the application's own SIGALRM handler
stop = graceful.install(deadline_s={DEADLINE_S})
stop.hold(held)
stop.on_stop(lambda: ctypes.PyDLL(None).sleep(60))  # a cleanup that keeps the GIL
print("ready", flush=True)
while not stop.should_stop():
    time.sleep(0.01)
stop.shutdown()
"""


def test_the_kernel_backstop_frees_a_cuda_process_stuck_holding_the_gil(evidence):
    proc = subprocess.Popen(
        [PY, "-c", textwrap.dedent(WORKER)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ()
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        wait_until(lambda: proc.pid in nvml_pids(), timeout=60)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = proc.wait(timeout=20)
        killed_after = time.monotonic() - t0
        wait_until(lambda: proc.pid not in nvml_pids(), timeout=20, interval=0.01)
        freed_after = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    result = {
        "exit": code,
        "killed_after_s": round(killed_after, 3),
        "nvml_freed_after_s": round(freed_after, 3),
        "deadline_s": DEADLINE_S,
        "grace_s": BACKSTOP_GRACE_S,
        "stderr": proc.stderr.read() if proc.stderr else "",
    }
    save(evidence, "backstop.json", result)
    print(result)
    assert code == -signal.SIGKILL, result
    # The upper margin covers the kernel's teardown of a CUDA process (its mappings, the driver's
    # close of /dev/nvidia*): 0.28 s for a torch process on this 2-core CPU machine, more on a GPU.
    assert DEADLINE_S + BACKSTOP_GRACE_S - 0.05 <= killed_after < DEADLINE_S + BACKSTOP_GRACE_S + 3.0, result
    assert freed_after < killed_after + 2.0, result
