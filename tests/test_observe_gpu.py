"""observe with a real CUDA worker in a PID namespace (the seed's scenario 1): run on a GPU machine.

The worker is an orphan of a parent that exited without wait(), under ``sleep`` as PID 1. Inside
the namespace and from the host, observe must list it live with its memory (never an orphaned
context), with its local pid inside and its host + local pid from the host.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from gpuzombie.gpu.nvml import PynvmlBackend
from markers import needs_root
from pidns import PidNamespace, wait_until

_SNAPSHOT = PynvmlBackend().read()
needs_gpu = pytest.mark.skipif(
    not (_SNAPSHOT.available and _SNAPSHOT.devices and importlib.util.find_spec("torch")),
    reason=f"no GPU/NVML/torch: {_SNAPSHOT.reason or 'no device or no torch'}",
)

pytestmark = [pytest.mark.gpu, needs_root, needs_gpu]


def _observe(argv: list[str]) -> dict:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_cuda_worker_in_namespace_is_live_inside_and_from_host(tmp_path):
    log = tmp_path / "parent.log"
    parent = f"{sys.executable} -m gpuzombie.workloads.parent --workers 1 --size-mib 2048 --device cuda > {log} 2>&1"
    with PidNamespace("sh", "-c", f"{parent} & exec sleep infinity") as ns:
        wait_until(lambda: log.exists() and "parent exiting" in log.read_text(), timeout=120, interval=0.2)
        assert "ready" in log.read_text(), log.read_text()
        (worker,) = [c for c in ns.children() if c.status() != "zombie"]
        inside = _observe(ns.enter(sys.executable, "-m", "gpuzombie", "observe", "--json"))
        host = _observe([sys.executable, "-m", "gpuzombie", "observe", "--json"])

    local = [g for g in inside["gpu_processes"] if g["verdict"] == "live"]
    assert len(local) == 1 and local[0]["used_memory_mib"] >= 2048
    assert inside["orphaned_contexts"] == []
    assert local[0]["local_pid"] in [o["pid"] for o in inside["orphans"]]  # orphaned, and alive
    mine = [g for g in host["gpu_processes"] if g["host_pid"] == worker.pid]
    assert len(mine) == 1 and mine[0]["verdict"] == "live"
    assert mine[0]["local_pid"] == local[0]["local_pid"]
    assert mine[0]["used_memory_mib"] == local[0]["used_memory_mib"]
    assert all(g["verdict"] != "gone" for g in host["gpu_processes"])
    assert not any(g["flagged"] for g in inside["ghosts"] if g["gpu_index"] == local[0]["gpu_index"])
    assert host["summary"]["orphaned_contexts"] == 0
    assert max(d["memory_used_mib"] for d in host["gpu"]["devices"]) >= 2048
