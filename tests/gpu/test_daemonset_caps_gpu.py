"""The node DaemonSet's two capabilities against real CUDA processes.

The chart runs ``gpuzombie trace`` as root with every capability dropped but DAC_READ_SEARCH and
SYS_PTRACE. Here a torch worker as UID 1000 (the seed's non-root variant) and one as root hold GPU
memory, and trace runs under five capability bounding sets: NVML lists both workers in every case;
seeing their ``/dev/nvidia*`` fds needs both capabilities (SYS_PTRACE alone misses the UID-1000
worker, whose fd/ directory is mode 0500; DAC_READ_SEARCH alone misses both: reading the links is a
ptrace check).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from gpupods import GPU_TEST, PY, environ, save, wait_ready, workload

pytestmark = GPU_TEST
SIZE_MIB = 1024
# bounding set -> (fds of the UID-1000 worker seen, fds of the root worker seen)
CASES = {
    "": (True, True),
    "-all,+dac_read_search,+sys_ptrace": (True, True),
    "-all,+sys_ptrace": (False, True),
    "-all,+dac_read_search": (False, False),
    "-all": (False, False),
}


def start_worker(uid: int, log_path: Path) -> subprocess.Popen[bytes]:
    """A worker as ``uid``, started as the lab's parent starts one (``Popen(user=...)``)."""
    as_uid = {"user": uid, "group": uid, "extra_groups": [], "env": environ()}
    try:
        probe = subprocess.run([PY, "-c", "import gpuzombie.workloads.worker"], capture_output=True, **as_uid)
    except PermissionError as exc:  # this Python is not executable by uid 1000
        pytest.skip(f"uid {uid} cannot run {PY}: {exc}")
    if probe.returncode != 0:  # the checkout is not readable by uid 1000
        pytest.skip(f"uid {uid} cannot import gpuzombie: {probe.stderr.decode()[-200:]}")
    with open(log_path, "w") as log:
        return subprocess.Popen(
            shlex.split(workload("worker", SIZE_MIB)), stdout=log, stderr=subprocess.STDOUT, **as_uid
        )


def test_trace_sees_fds_only_with_both_capabilities(tmp_path, evidence):
    workers = {uid: start_worker(uid, tmp_path / f"worker-{uid}.log") for uid in (1000, 0)}
    try:
        for uid in workers:
            wait_ready(tmp_path / f"worker-{uid}.log")
        seen = {}
        for bounding, expected in CASES.items():
            prefix = ["setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--"] if bounding else []
            done = subprocess.run(
                [*prefix, PY, "-m", "gpuzombie", "trace", "--json"], capture_output=True, text=True, timeout=60
            )
            assert done.returncode in (0, 1), done.stderr
            rows = {r["pid"]: r for r in json.loads(done.stdout)["rows"]}
            name = bounding or "all (root)"
            save(evidence, f"trace {name}.json", done.stdout)
            seen[name] = [(uid, rows.get(w.pid)) for uid, w in workers.items()]
            print(
                f"{name:36}",
                "  ".join(
                    f"uid {uid}: nvml {'yes' if r and r['nsmi'] else 'no'} {r and r['gpu_memory_mib']} MiB, "
                    f"fds {'yes' if r and r['devices'] else 'no'}"
                    for uid, r in seen[name]
                ),
            )
            for (uid, row), fds in zip(seen[name], expected):
                assert row is not None and row["nsmi"] and row["gpu_memory_mib"] >= SIZE_MIB, (name, uid, row)
                assert bool(row["devices"]) == fds, (name, uid, row["devices"])
    finally:
        for worker in workers.values():
            worker.kill()
            worker.wait()
