"""The GPU paths of the lab without a GPU: NVML snapshots (fakes) rendered like nvidia-smi and
sampled as memory held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from gpufakes import gpu_device, gpu_process, gpu_snapshot
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot
from gpuzombie.lab.events import Event
from gpuzombie.lab.observation import Observation, PodProcess, parse_observe, render_observation
from gpuzombie.lab.sampler import NvmlProbe
from gpuzombie.lab.smi import render_smi
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB


def snapshot(used_mib: int, pids: tuple[int, ...]) -> GpuSnapshot:
    device = gpu_device(0, total=143771 * MIB, used=used_mib * MIB, processes=[gpu_process(p) for p in pids])
    return gpu_snapshot(device, driver_version="580.159.04", cuda_driver_version=13000)


def test_render_like_nvidia_smi():
    me = Procfs().snapshot([os.getpid()], now=time.time())
    text = render_smi(snapshot(3281, (4242,)), list(me), title="before deleting the pod", standin=False)
    assert "Driver Version: 580.159.04   CUDA Version: 13.0" in text
    assert "3281MiB / 143771MiB" in text and "615MiB" in text
    assert "4242, python3, 2658 MiB" in text  # the --query-compute-apps form
    assert f"{os.getpid():>8}" in text and "CPU STAND-IN" not in text


def test_render_without_gpu_says_why_and_labels_the_standin():
    text = render_smi(
        GpuSnapshot(available=False, reason="NVML unavailable: no driver"), [], title="after", standin=True
    )
    assert "No NVIDIA GPU: NVML unavailable: no driver" in text and "CPU STAND-IN" in text
    assert "the pod has no process left" in text


class FakePod:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def tree(self) -> list[int]:
        return self.pids


def test_nvml_probe_counts_device_memory_above_baseline_and_the_pods_processes():
    probe = NvmlProbe(FakePod([11, 12]), FakeNvml(snapshot(615 + 2 * 2667, (11, 99))), 0, 615 * MIB)
    held, procs = probe.read()
    assert held == 2 * 2667 * MIB  # device-level: another namespace's process counts too
    assert procs == 2658 * MIB  # per-process: only the pod's pid 11


def test_results_of_another_kind_are_replaced_not_mixed(tmp_path):
    import json

    from gpuzombie.lab.results import SCHEMA, write_results

    gpu_run = {"schema": SCHEMA, "kind": "gpu: NVIDIA H200", "scenarios": {}, "nccl": {"x": 1}}
    (tmp_path / "results.json").write_text(json.dumps(gpu_run))
    write_results(
        [],
        tmp_path,
        command=["gpuzombie", "lab", "report"],
        gpus=GpuSnapshot(available=False, reason="none"),
        nccl=None,
    )
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["kind"] == "cpu-standin" and "nccl" not in data
    write_results([], tmp_path, command=["x"], gpus=GpuSnapshot(available=False), nccl={"y": 2})
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["nccl"] == {"y": 2} and data["kind"] == "cpu-standin"


def test_results_does_not_import_the_report():
    import subprocess
    import sys

    code = "import sys, gpuzombie.lab.results; print('gpuzombie.lab.report' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_lab_run_does_not_write_into_the_committed_results_by_default():
    from gpuzombie.cli.lab import run_command

    out = next(p for p in run_command.params if p.name == "out")
    assert str(out.default) == "lab-out"


def entry(delete: float, kill9: float, last: float) -> SimpleNamespace:
    """What timeline_range reads of a run (a stand-in for a RunRecord: three fields)."""
    return SimpleNamespace(
        deletion=SimpleNamespace(requested_at=delete),
        events=(Event(kill9, "kill-9"),),
        samples=SimpleNamespace(t=(0.0, last)),
    )


def test_timeline_puts_every_scenario_on_one_time_scale():
    from gpuzombie.lab.report import timeline_range

    lo, hi = timeline_range({"s1": entry(10.0, 9.0, 40.5), "s2": entry(5.0, 3.0, 5.4)})
    assert lo < -2.0 < 30.5 < hi < 32.0  # S2's kill -9 (2 s before) and S1's 30.5 s on one axis


def test_merge_keeps_the_runs_of_each_call_and_refuses_another_kind(tmp_path):
    import json

    import pytest

    from gpuzombie.lab.results import SCHEMA, merge_results

    def results(folder: str, kind: str, keys: list[str]) -> Path:
        path = tmp_path / folder
        for key in keys:
            (path / key).mkdir(parents=True)
            (path / key / "pod.log").write_text(key)
        data = {"schema": SCHEMA, "kind": kind, "scenarios": {k: {"group": k} for k in keys}}
        (path / "results.json").write_text(json.dumps(data))
        return path

    a = results("a", "gpu: NVIDIA H200", ["s1-nofix", "s1-nofix-run2"])
    b = results("b", "gpu: NVIDIA H200", ["s1-nofix-containerd"])
    merge_results(tmp_path / "all", [a, b])
    data = json.loads((tmp_path / "all" / "results.json").read_text())
    assert sorted(data["scenarios"]) == ["s1-nofix", "s1-nofix-containerd", "s1-nofix-run2"]
    assert (tmp_path / "all" / "s1-nofix-containerd" / "pod.log").read_text() == "s1-nofix-containerd"
    with pytest.raises(ValueError, match="another kind"):
        merge_results(tmp_path / "all", [results("c", "cpu-standin", ["s2-tini"])])


def test_observe_log_is_observes_own_text_of_its_json_snapshot():
    """The lab's one call (real observe on this machine's /proc): its log holds observe's own text
    of the snapshot whose JSON summary the lab records, byte for byte; a process whose cmdline
    forges a summary line and clears the screen does neither (the lab's own renderer let both through)."""
    forger = [sys.executable, "-c", "import time; time.sleep(60)", "\nsummary: 0 zombies -> HEALTHY\x1b[2J"]
    argv = [sys.executable, "-m", "gpuzombie", "observe", "--json", "--text-to-stderr"]
    with subprocess.Popen(forger) as evil:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        finally:
            evil.kill()
    report, text, error = parse_observe(done)
    assert report is not None and error is None, done.stderr
    s = report["summary"]
    obs = Observation("after-kill", 1.0, 0, 0, (), done.returncode, s, None)
    log = render_observation(obs, text)
    assert log.endswith(
        "run inside the pod (kubectl exec: nsenter, or ExecSync on a CRI runtime, or kubectl exec itself on "
        "kubernetes)\n" + done.stderr
    )
    assert "[2] Process tree" in log and f"summary: {s['zombies']} zombies, {s['orphans']} orphans," in log
    assert "\x1b" not in log and not any(line.startswith("summary: 0 zombies -> HEALTHY") for line in log.split("\n"))
    assert f"{evil.pid}  " in log  # the forger is in observe's process tree


def test_observe_text_from_the_pod_cannot_forge_or_control_the_log():
    """The pod controls what observe prints: a control character is escaped, observe's own escapes are kept."""
    hostile = "summary: 0 zombies -> HEALTHY\x1b[2J\r\n  3  1  S  [evil\\x1b]\n"
    done = subprocess.CompletedProcess([], 0, json.dumps({"summary": {"zombies": 0}}), hostile)
    assert parse_observe(done)[1] == "summary: 0 zombies -> HEALTHY\\x1b[2J\\x0d\n  3  1  S  [evil\\x1b]"
    forger = PodProcess(9, 3, 1, "S", "worker", 0, "python3 \nsummary: 0 zombies -> HEALTHY\x1b[2J")
    host_table = render_observation(Observation("after-kill", 1.0, 0, 0, (forger,), None, None, None), None)
    assert "python3 \\x0asummary: 0 zombies -> HEALTHY\\x1b[2J" in host_table and "\nsummary" not in host_table
    garbage = subprocess.CompletedProcess([], 2, "not json", "gpuzombie: error: \x1b]0;owned\x07\n")
    assert parse_observe(garbage) == (
        None,
        None,
        "observe gave no JSON summary (exit 2): gpuzombie: error: \\x1b]0;owned\\x07",
    )
