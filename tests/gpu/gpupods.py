"""What the GPU tests share: the skip marks, pods running the seed's workloads on CUDA (built with
tests/pidns.py), reads of NVML, and the JSON of a gpuzombie command."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gpuzombie.gpu.nvml import default_backend, read_gpus
from gpuzombie.lab.runtime.pidns import absolute_pythonpath
from markers import needs_root
from pidns import PidNamespace, wait_until

SNAPSHOT = read_gpus(default_backend())
GPUS = len({d.index for d in SNAPSHOT.devices}) if SNAPSHOT.available else 0  # GPUs, not MIG instances
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_gpu = pytest.mark.skipif(
    not (GPUS and HAS_TORCH),
    reason=f"needs an NVIDIA GPU, NVML and torch: {SNAPSHOT.reason or ('no torch' if GPUS else 'no GPU')}",
)
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs, NVML sees {GPUS}")
GPU_TEST = [pytest.mark.gpu, needs_root, needs_gpu]
"""``pytestmark`` of every file here."""

PY = sys.executable
# The multi-GPU machines need these in every process (DEVICE-FACTS: NVLink multicast off).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def workload(module: str, size_mib: int, *options: str) -> str:
    """The shell command of one of the seed's workloads, holding ``size_mib`` through torch on GPU 0."""
    return " ".join(
        [
            PY,
            "-m",
            f"gpuzombie.workloads.{module}",
            "--size-mib",
            str(size_mib),
            "--device",
            "cuda",
            "--backend",
            "torch",
            *options,
        ]
    )


def parent_pod(log: Path, *, workers: int, size_mib: int, cgroup: Path | None = None) -> PidNamespace:
    """The seed's scenario 1: PID 1 is ``sleep``; the parent starts its workers and exits without wait()."""
    parent = workload("parent", size_mib, "--workers", str(workers))
    return PidNamespace("sh", "-c", f"{parent} > {log} 2>&1 & exec sleep infinity", cgroup=cgroup)


def wait_parents_done(log: Path, parents: int = 1) -> None:
    """Until ``parents`` parents printed their exit line (each after its workers held their memory)."""
    wait_until(lambda: log.read_text().count("parent exiting") >= parents if log.exists() else False, timeout=180)
    assert "error" not in log.read_text(), log.read_text()


def wait_ready(log: Path, count: int = 1) -> None:
    """Until ``count`` workers writing into ``log`` hold their memory."""
    wait_until(lambda: log.exists() and log.read_text().count("ready pid=") >= count, timeout=180, interval=0.2)


def live_children(ns: PidNamespace) -> list[psutil.Process]:
    """The host view of PID 1's children that are not zombies (the orphaned workers)."""
    return [c for c in ns.children() if c.status() != psutil.STATUS_ZOMBIE]


def nvml_pids() -> set[int]:
    """Host pids NVML lists now, on every GPU."""
    return {p.pid for d in default_backend().read().devices for p in d.processes}


def gpuzombie_json(*args: str, enter: PidNamespace | None = None) -> dict:
    """``python3 -m gpuzombie <args> --json`` on the host or inside a pod; findings (exit 1) are fine."""
    argv = [PY, "-m", "gpuzombie", *args, "--json"]
    done = subprocess.run(enter.enter(*argv) if enter else argv, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def save(folder: Path, name: str, data: dict | str) -> None:
    """Keep what a test saw (the device script collects the folder under $OUT)."""
    text = data if isinstance(data, str) else json.dumps(data, indent=1)
    (folder / name).write_text(text)


def environ() -> dict[str, str]:
    """This environment as the lab gives a pod (PYTHONPATH absolute), with the NCCL settings."""
    return {**absolute_pythonpath(os.environ), **NCCL_ENV}
