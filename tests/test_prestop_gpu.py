"""prestop against real CUDA workers: inside a pod, and from the host with a cgroup scope (GPU machine).

Inside a PID namespace (``sleep`` as PID 1) an orphaned worker holding 1 GiB is found by its
/dev/nvidia* fds and by NVML, and stopped. In the host's PID namespace two workers hold memory, one
in a fresh cgroup: ``--cgroup`` stops that one only, and NVML's host pid is what names it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

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

WORKER = """
import time, torch
x = torch.empty(256 * 1024 * 1024, device="cuda")  # 1 GiB
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""
HOOK = (sys.executable, "-m", "gpuzombie.prestop", "--json", "--timeout", "5", "--kill-wait", "2")


def _nvml_pids() -> set[int]:
    return {p.pid for d in PynvmlBackend().read().devices for p in d.processes}


def _ready(log: Path) -> bool:
    return log.exists() and "ready" in log.read_text()


def _worker(tmp_path: Path, name: str) -> tuple[str, Path]:
    """The command line of a CUDA worker holding 1 GiB, and the log it says "ready" in."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    log = tmp_path / f"{name}.log"
    return f"{sys.executable} {script} > {log} 2>&1", log


def test_cuda_orphan_in_a_pod_is_stopped_through_fds_and_nvml(tmp_path):
    worker_cmd, log = _worker(tmp_path, "orphan")
    # The worker's shell exits at once: the worker is re-parented to PID 1, which then becomes sleep.
    with PidNamespace("sh", "-c", f"sh -c '{worker_cmd} &'; exec sleep infinity") as ns:
        wait_until(lambda: _ready(log), timeout=120, interval=0.2)
        (worker,) = [c for c in ns.children() if c.status() != "zombie"]
        done = ns.run(*HOOK, timeout=60)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        wait_until(lambda: worker.pid not in _nvml_pids(), timeout=10)
    (result,) = report["results"]
    reasons = result["target"]["reasons"]
    assert any(r.startswith("holds /dev/nvidia") for r in reasons), reasons
    assert any(r.startswith("listed by NVML") for r in reasons), reasons
    assert any(r.startswith("orphan: PID 1 is sleep") for r in reasons), reasons
    assert result["outcome"] == "exited_after_sigterm"
    assert report["incomplete"] == 0 and report["pid1_log"] == "written to /proc/1/fd/1"


def _cgroup2_root() -> str:
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(f"{root}/cgroup.controllers"):
            return root
    pytest.skip("no cgroup v2 hierarchy")


def test_host_namespace_scope_stops_only_the_worker_in_its_cgroup(tmp_path):
    root = _cgroup2_root()
    group = f"{root}/gpuzombie-prestop-gpu-{os.getpid()}"
    os.mkdir(group)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, enter in (("inside", f"echo $$ > {group}/cgroup.procs && "), ("outside", "")):
            worker_cmd, log = _worker(tmp_path, name)
            workers[name] = subprocess.Popen(["sh", "-c", f"{enter}exec {worker_cmd}"], start_new_session=True)
            wait_until(lambda log=log: _ready(log), timeout=120, interval=0.2)
        refused = subprocess.run([*HOOK], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "--cgroup PATH or --container ID" in refused.stderr
        done = subprocess.run([*HOOK, "--cgroup", group[len(root) :]], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert workers["inside"].wait(timeout=10) < 0  # ended by prestop's signal
        assert workers["outside"].poll() is None and workers["outside"].pid in _nvml_pids()
    finally:
        for w in workers.values():
            w.kill()
            w.wait()
        os.rmdir(group)
    (result,) = report["results"]
    assert result["target"]["pid"] == workers["inside"].pid and result["outcome"] == "exited_after_sigterm"
    assert any(r.startswith("listed by NVML") for r in result["target"]["reasons"])
    assert report["scope_matched"] == 1 and report["in_root_pidns"]
