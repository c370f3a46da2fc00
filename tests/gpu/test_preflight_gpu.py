"""The handover gate on a real GPU (skipped without one): the zipapp as the webhook injects it
(``python3 -S -I preflight.pyz``), against the real NVML.

- It never blocks a clean GPU: the idle GPU (the driver's reservation, which NVML's v2 memory info
  reports apart) passes, and so does the GPU after a process made a CUDA context, allocated and
  exited (what the previous pod leaves when it ends well).
- A CUDA context still alive, even idle, is a holder: its ~0.5 GiB is what the next pod would miss,
  so the gate says dirty (recorded, with the context's size, as evidence).
- It fails closed on an NVML error: a libnvidia-ml.so.1 that does not load (first on
  LD_LIBRARY_PATH) is "not clean" with the reason, and passes only with --fail-open.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpupods import GPU_TEST, PY, save
from gpuzombie.prestop.zipapp import build

pytestmark = GPU_TEST

CONTEXT = (
    "import sys, torch\n"
    "x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
    "del x; torch.cuda.empty_cache(); print('ready', flush=True); sys.stdin.read()\n"
)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("gate") / "preflight.pyz", app="preflight")


def run_gate(gate: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    argv = [PY, "-S", "-I", str(gate), "--wait", "0", "--json", "--termination-log", "", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    return done.returncode, json.loads(done.stdout)


def test_an_idle_gpu_and_one_a_context_has_left_are_clean(gate: Path, evidence: Path):
    code, idle = run_gate(gate)
    save(evidence, "idle.json", idle)
    assert code == 0 and idle["outcome"] == "clean", idle
    assert all(g["reserved_mib"] is not None and g["reserved_mib"] > 0 for g in idle["gpus"]), idle
    done = subprocess.run(
        [PY, "-c", CONTEXT, "1024"], input="", capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0 and "ready" in done.stdout, done.stderr
    code, after = run_gate(gate)
    save(evidence, "after-a-context.json", after)
    assert code == 0 and after["outcome"] == "clean", after


def test_a_live_idle_context_is_a_holder(gate: Path, evidence: Path):
    holder = subprocess.Popen([PY, "-c", CONTEXT, "64"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and "ready" in holder.stdout.readline()
        time.sleep(0.5)
        code, seen = run_gate(gate)
    finally:
        holder.communicate(input="", timeout=60)
    save(evidence, "live-context.json", seen)
    assert code == 1 and seen["outcome"] == "dirty", seen
    assert max(g["held_mib"] for g in seen["gpus"]) > 100  # a context's own memory, its tensors freed


def test_an_nvml_that_does_not_load_fails_closed_unless_fail_open(gate: Path, tmp_path: Path, evidence: Path):
    broken = tmp_path / "lib"
    broken.mkdir()
    (broken / "libnvidia-ml.so.1").write_bytes(b"not an ELF file")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{broken}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    code, closed = run_gate(gate, env=env)
    save(evidence, "broken-nvml.json", closed)
    assert code == 1 and closed["outcome"] == "unreadable", closed
    assert "NVML" in closed["message"] and "GpuzombieNvmlUnavailable" in closed["message"]
    code, opened = run_gate(gate, "--fail-open", env=env)
    assert code == 0 and opened["outcome"] == "passed-open", opened
