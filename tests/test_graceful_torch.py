"""gpuzombie.graceful in a real torch.distributed job (gloo on CPU): a dead rank stops the others."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuzombie.lab.nccl.launch import free_port

pytestmark = pytest.mark.slow  # torch ranks in fresh processes
SRC = str(Path(__file__).resolve().parents[1] / "src")
RANK = """
import os, sys, time
import torch.distributed as dist
from gpuzombie import graceful
dist.init_process_group("gloo", init_method="env://")
stop = graceful.install(deadline_s=10, peer_exit_s=1.0)
print("ready", flush=True)
with stop:
    while not stop.should_stop():
        time.sleep(0.01)
"""


def start_job(world: int) -> list[subprocess.Popen]:
    pytest.importorskip("torch.distributed")  # here, not at collection: importing torch takes seconds
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONPATH": SRC,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return procs


@pytest.mark.parametrize("victim", [0, 2], ids=["store-host-rank-0", "rank-2"])
def test_a_dead_rank_stops_every_other_rank(victim):
    procs = start_job(3)
    procs[victim].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    for i, p in enumerate(procs):
        if i == victim:
            p.wait()
            continue
        assert p.wait(timeout=10) == 75, p.stderr.read()
    assert time.monotonic() - t0 < 3.0
    err = procs[(victim + 1) % 3].stderr.read()
    assert "peer lost" in err
