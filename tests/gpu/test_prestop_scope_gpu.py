"""``gpuzombie prestop`` in the host's PID namespace against real CUDA workers: only with a scope.

Two workers hold 1 GiB each through torch (both free their memory and exit on SIGTERM), one of them
in a fresh cgroup. Without ``--cgroup``/``--container`` the hook refuses (exit 2) and both live on;
with ``--cgroup`` it stops the one inside, found by its /dev/nvidia* fds and by NVML's host pid, and
leaves the other holding its memory.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpupods import GPU_TEST, PY, nvml_pids, save, wait_ready, workload

CGROUP_ROOT = Path("/sys/fs/cgroup")
pytestmark = [
    *GPU_TEST,
    pytest.mark.skipif(not (CGROUP_ROOT / "cgroup.controllers").exists(), reason="needs a cgroup v2 hierarchy"),
]
HOOK = (PY, "-m", "gpuzombie.prestop", "--json", "--timeout", "5", "--kill-wait", "2")


def test_host_namespace_scope_stops_only_the_worker_in_its_cgroup(tmp_path, evidence):
    group = CGROUP_ROOT / f"gpuzombie-prestop-scope-{os.getpid()}"
    group.mkdir()
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, join in (("inside", f"echo $$ > {group}/cgroup.procs && "), ("outside", "")):
            log = tmp_path / f"{name}.log"
            command = f"{join}exec {workload('worker_fixed', 1024)} > {log} 2>&1"
            workers[name] = subprocess.Popen(["sh", "-c", command], start_new_session=True)
            wait_ready(log)
        refused = subprocess.run(HOOK, capture_output=True, text=True, timeout=60)
        scoped = subprocess.run([*HOOK, "--cgroup", f"/{group.name}"], capture_output=True, text=True, timeout=60)
        inside_exit = workers["inside"].wait(timeout=30)
        outside_alive = workers["outside"].poll() is None and workers["outside"].pid in nvml_pids()
    finally:
        for worker in workers.values():
            worker.kill()
            worker.wait()
        group.rmdir()
    report = json.loads(scoped.stdout)
    save(evidence, "prestop.json", report)
    print(f"refused without a scope: exit {refused.returncode}; with --cgroup: exit {scoped.returncode}")
    for r in report["results"]:
        print(f"  pid {r['target']['pid']}: {r['outcome']} after {r['exited_after_s']} s ({r['target']['reasons']})")
    assert refused.returncode == 2 and "--cgroup PATH or --container ID" in refused.stderr
    assert scoped.returncode == 0, scoped.stderr
    (result,) = report["results"]
    assert result["target"]["pid"] == workers["inside"].pid and result["outcome"] == "exited_after_sigterm"
    assert any(r.startswith("listed by NVML") for r in result["target"]["reasons"])
    assert report["in_root_pidns"] and report["scope_matched"] == 1 and report["incomplete"] == 0
    assert inside_exit == 0 and outside_alive  # the handler freed the memory and exited; the other held on
