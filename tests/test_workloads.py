"""The workloads: real processes holding real (CPU stand-in) memory, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpuzombie.gpu.nvml import PynvmlBackend
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.runtime.pidns import Pod, children_of
from gpuzombie.lab.runtime.pod import leftovers
from gpuzombie.workloads.memory import (
    CPU_STANDIN,
    CPU_STANDIN_LABEL,
    MIB,
    MemoryBackendError,
    hold,
    resolve_backend,
)
from markers import needs_root

SIZE = 32


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def start(module: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--size-mib", str(SIZE), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline()


def test_cpu_standin_holds_touched_memory_and_says_so():
    before = rss(os.getpid())
    holding = hold(SIZE, device="cpu")
    assert holding.backend == CPU_STANDIN and holding.label == CPU_STANDIN_LABEL
    assert rss(os.getpid()) - before >= SIZE * MIB * 0.9  # every page touched: resident
    holding.release()
    holding.release()  # idempotent
    assert rss(os.getpid()) - before < SIZE * MIB * 0.5


def test_backend_resolution():
    assert resolve_backend("cpu", "torch") == CPU_STANDIN
    with pytest.raises(MemoryBackendError):
        resolve_backend("tpu", "auto")
    with pytest.raises(MemoryBackendError):
        resolve_backend("cpu", "jax")


def test_worker_ignores_sigterm_and_holds_until_sigkill():
    proc, line = start("gpuzombie.workloads.worker")
    assert line.startswith(f"ready pid={proc.pid} backend=cpu-standin") and "CPU STAND-IN" in line
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None and rss(proc.pid) >= SIZE * MIB
    proc.kill()
    assert proc.wait(5) == -signal.SIGKILL


def test_worker_fixed_frees_and_exits_on_sigterm():
    proc, line = start("gpuzombie.workloads.worker_fixed")
    assert line.startswith("ready ")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0
    assert "released" in proc.stderr.read()


@needs_root
def test_parent_exits_without_wait_and_leaves_orphans():
    events = EventLog()
    cmd = [sys.executable, "-m", "gpuzombie.workloads.parent", "--workers", "2", "--size-mib", "8", "--device", "cpu"]
    with open(os.devnull, "w") as sink:
        pod = Pod("t", "sleep", cmd, log=sink, events=events)
        pod.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(children_of(pod.pid1)) < 3:
                time.sleep(0.02)
            time.sleep(0.3)
            states = {}
            for pid in children_of(pod.pid1):
                with open(f"/proc/{pid}/stat") as f:
                    states[pid] = f.read().rsplit(")", 1)[1].split()[0]
            # the parent is a zombie of PID 1 (sleep); its two workers were re-parented to PID 1
            assert sorted(states.values()).count("Z") == 1
            assert len([s for s in states.values() if s != "Z"]) == 2
        finally:
            pod.kill()
    assert leftovers(pod.processes) == ()


def test_parent_standalone_reports_ready_workers():
    # stderr to /dev/null: the orphan inherits it, and a pipe would stay open after the parent
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuzombie.workloads.parent",
            "--workers",
            "1",
            "--size-mib",
            "8",
            "--device",
            "cpu",
            "--fixed",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=60,
        check=False,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[-1].startswith("parent exiting")
    worker = int(lines[0].split(": ")[1])
    assert lines[1].startswith(f"ready pid={worker}")
    os.kill(worker, signal.SIGTERM)  # the orphan is not ours to wait for: stop it by pid
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "ctypes"])
def test_gpu_backends_hold_gpu_memory(backend):
    gpus = PynvmlBackend().read()
    if not gpus.available or not gpus.devices:
        pytest.skip(f"no GPU: {gpus.reason}")
    if backend == "torch":
        pytest.importorskip("torch")
    # NVML's own entry for the holder, not the device total: other processes may come and go meanwhile
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import os; from gpuzombie.workloads.memory import hold; from gpuzombie.gpu.nvml import PynvmlBackend\n"
                f"h=hold(256, device='cuda', backend='{backend}')\n"
                "mine=[p.used_memory for p in PynvmlBackend().read().device(0).processes if p.pid == os.getpid()]\n"
                "h.release(); print(mine[0] if mine else 0, h.backend)"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    held, name = out.stdout.split()
    assert name == backend and int(held) >= 256 * MIB
