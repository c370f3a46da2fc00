"""MIG on a real GPU, read only: skipped unless a GPU already has MIG mode on (these tests never change
a GPU's MIG mode, nor create or destroy instances). Each GPU instance must come through its MIG
device handles with dcgm-exporter's profile name, and a torch worker on one MIG device must be
listed on that instance only, with its memory, and no instance called a ghost."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from gpupods import HAS_TORCH, SNAPSHOT
from gpuzombie.gpu.attribution import current_view
from gpuzombie.gpu.nvml import PynvmlBackend
from gpuzombie.jsonout import dumps
from gpuzombie.observe.model import observe
from gpuzombie.proc.procfs import Procfs
from markers import needs_root

MIG_GPUS = sorted({d.index for d in SNAPSHOT.devices if d.mig_mode}) if SNAPSHOT.available else []
pytestmark = [
    pytest.mark.gpu,
    needs_root,
    pytest.mark.skipif(not MIG_GPUS, reason="needs a GPU with MIG mode on (never switched on by a test)"),
]


def test_each_instance_is_read_with_its_profile(evidence):
    snap = PynvmlBackend().read()
    (evidence / "snapshot.json").write_text(dumps(snap))
    for index in MIG_GPUS:
        entries = [d for d in snap.devices if d.index == index]
        instances = [d.mig for d in entries if d.mig is not None]
        assert instances, f"GPU {index}: MIG mode on, no GPU instance read: {entries}"
        ids = [m.gpu_instance_id for m in instances]
        assert len(ids) == len(set(ids))
        for m in instances:
            assert re.fullmatch(r"\d+g\.\d+gb\S*", m.profile), m.profile
            assert all(u.startswith("MIG-") for u in m.uuids), m.uuids
        for d in entries:
            assert d.memory_used >= d.process_memory and d.memory_total > 0


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_a_worker_on_one_mig_device_is_listed_on_that_instance(evidence):
    target = next(d for d in SNAPSHOT.devices if d.mig is not None)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": target.mig.uuids[0]}
    code = (
        "import torch, time; x = torch.ones(128 * 1024 * 1024, device='cuda'); torch.cuda.synchronize();"
        "print('ready', flush=True); time.sleep(60)"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        time.sleep(1)
        report = observe(Procfs(), PynvmlBackend(), current_view())
        (evidence / "observe.json").write_text(json.dumps(report.to_dict(), indent=2))
        mine = [r for r in report.attribution.processes if r.nvml_pid == worker.pid]
        assert [(r.gpu_index, r.mig.gpu_instance_id if r.mig else None) for r in mine] == [
            (target.index, target.mig.gpu_instance_id)
        ]
        assert mine[0].used_memory is None or mine[0].used_memory >= 512 * 1024 * 1024
        assert not any(g.flagged for g in report.attribution.ghosts), report.attribution.ghosts
    finally:
        worker.kill()
        worker.wait()
