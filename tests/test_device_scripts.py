"""The GPU machine's scripts, checked here: a call there is scarce, and a script that fails there on a
syntax error or a pod spec of the wrong shape costs the whole call (each script's header says how to
run it; what they measured is in results/)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
DEVICE = REPO / "scripts" / "device"


@pytest.mark.parametrize("script", sorted(DEVICE.glob("*.sh")), ids=lambda p: p.name)
def test_every_device_shell_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_kube_gpu_names_every_action_in_its_usage_line() -> None:
    text = (DEVICE / "kube_gpu.sh").read_text()
    cases = text[text.rindex("case $ACTION in") :]
    actions = [line.split(")")[0].strip() for line in cases.splitlines()[1:] if ")" in line and "*)" not in line]
    usage = next(line for line in cases.splitlines() if "usage:" in line)
    assert actions and all(a in usage for a in actions), (actions, usage)


@pytest.fixture
def chart_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.setattr(sys, "argv", ["kube_chart_gpu.py", str(tmp_path)])
    spec = importlib.util.spec_from_file_location("kube_chart_gpu", DEVICE / "kube_chart_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_handovers_pods_are_what_the_webhook_and_the_nvidia_runtime_expect(chart_script: ModuleType) -> None:
    a, b = chart_script.pod_a("a"), chart_script.pod_b("b")
    assert a["metadata"]["labels"]["gpuzombie.dev/inject"] == "false"  # the webhook's objectSelector skips it
    assert a["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert b["metadata"]["annotations"] == {"gpuzombie.dev/preflight": "true"}  # the gate, injected when served
    assert b["spec"]["runtimeClassName"] == "nvidia"  # NVML for the gate, the CUDA driver for the worker
    (train,) = b["spec"]["containers"]
    assert train["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert train["command"][:3] == ["python3", "-m", "gpuzombie.workloads.worker_fixed"]
    assert "--backend" in train["command"] and "ctypes" in train["command"]  # the node image has no torch


def test_who_ended_the_holder_is_reap_only_where_reap_named_it(chart_script: ModuleType) -> None:
    named = [{"json": {"stale_pods": [{"holders": [41, 42]}]}}]
    assert chart_script._reaper(named, 42) == "gpuzombie reap"
    assert chart_script._reaper(named, 7).startswith("the kubelet")
    assert chart_script._reaper([], 42).startswith("the kubelet")


def test_gpu_pids_reads_nvmls_devices(chart_script: ModuleType) -> None:
    """The device run once failed here on an attribute (``.gpus``): without NVML the set is empty."""
    assert isinstance(chart_script.gpu_pids(), set)


def test_the_charts_values_name_the_clusters_sockets(chart_script: ModuleType) -> None:
    values = chart_script.values(b"-----BEGIN CERTIFICATE-----\n")
    layout = chart_script.LAYOUT
    assert values["exporter"]["cri"]["socket"] == str(layout.containerd_socket)
    assert values["exporter"]["podResourcesDir"] == str(layout.kubelet_root / "pod-resources")
    assert values["webhook"]["certManager"] == {"enabled": False}


def test_start_times_are_on_the_boot_clock_the_handover_measures_with(chart_script: ModuleType) -> None:
    started = chart_script.proc_start(os.getpid())
    assert 0 < started <= time.clock_gettime(time.CLOCK_BOOTTIME)
    with pytest.raises(RuntimeError, match="gone"):
        chart_script.proc_start(2**22 + 1)  # above pid_max's ceiling: no such process
