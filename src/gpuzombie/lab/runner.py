"""A whole ``lab run`` as a library call: choose the device, run the scenarios, write and render.

The CLI parses options into a ``LabRequest`` and renders the ``LabOutcome``; everything between
(the device choice, the checks before the first pod, the run loop, results.json, the report) is
here, so a library user runs the lab without click.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuzombie.errors import GpuzombieError
from gpuzombie.gpu.nvml import GpuSnapshot, NvmlBackend, default_backend
from gpuzombie.lab import report
from gpuzombie.lab.pod import PodError
from gpuzombie.lab.results import write_results
from gpuzombie.lab.scenarios import SCENARIOS, LabConfig, ScenarioError, ScenarioRun, run_scenario
from gpuzombie.workloads.memory import CPU_STANDIN, CPU_STANDIN_LABEL, torch_installed

Progress = Callable[[str], None]
NCCL = "nccl"


def choose_device_and_backend(device: str, backend: str, gpus_available: bool) -> tuple[str, str]:
    """(device, backend) to use: a GPU when NVML sees one, else the labelled CPU stand-in."""
    if device == "auto":
        device = "cuda" if gpus_available else "cpu"
    if device == "cuda" and not gpus_available:
        raise GpuzombieError("--device cuda: NVML sees no GPU here (use --device cpu or auto)")
    if device == "cpu":
        return device, CPU_STANDIN
    if backend == "auto":
        backend = "torch" if torch_installed() else "ctypes"
    if backend == "torch" and not torch_installed():
        raise GpuzombieError("--backend torch: torch is not installed (use --backend ctypes)")
    return device, backend


def check_can_make_pods() -> None:
    """Fail in one line before the first pod rather than in the middle of a scenario."""
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise GpuzombieError(f"the lab needs util-linux's {' and '.join(missing)} on PATH")
    if os.geteuid() != 0:
        raise GpuzombieError("the lab makes PID namespaces and enters them: run it as root")


@dataclass(frozen=True)
class LabRequest:
    """What to run, as the user asked it (``device`` and ``backend`` may be ``auto``)."""

    scenarios: Sequence[str]
    """Scenario names from ``SCENARIOS``, and/or ``nccl``."""
    config: LabConfig
    out: Path
    command: Sequence[str]
    """The exact command, recorded as provenance."""
    device: str = "auto"
    backend: str = "auto"
    ranks: int | None = None


@dataclass(frozen=True)
class LabOutcome:
    runs: tuple[ScenarioRun, ...]
    results_path: Path
    gpus: GpuSnapshot
    standin: bool
    """The scenarios ran on the CPU stand-in (host memory, no GPU)."""


def run_nccl(ranks: int | None, device: str, out: Path, progress: Progress) -> Mapping[str, Any]:
    """The NCCL comparison; ``device`` as given (``auto`` falls back to gloo below 2 GPUs)."""
    try:  # imported here: only this scenario needs it, and a trimmed install may lack it
        from gpuzombie.lab.nccl import run_nccl_comparison
    except ImportError as exc:
        raise GpuzombieError(f"nccl scenario not available ({exc})") from exc
    return run_nccl_comparison(
        ranks=ranks, device=device, out_dir=out, cases=None, observe_seconds=None, progress=progress
    )


def run_one(scenario: str, config: LabConfig, nvml: NvmlBackend, progress: Progress) -> ScenarioRun:
    """One scenario; a pod that cannot start or a workload that fails is a one-line error."""
    try:
        return run_scenario(SCENARIOS[scenario], config, nvml=nvml, progress=progress)
    except (ScenarioError, PodError) as exc:
        raise GpuzombieError(str(exc)) from exc


def run_lab(
    request: LabRequest,
    *,
    nvml: NvmlBackend | None = None,
    progress: Callable[[int, int, str], None] = lambda _n, _total, _line: None,
) -> LabOutcome:
    """Run every requested scenario in order, write OUT/results.json and render the report.

    ``progress(step, steps, line)`` reports each step as it happens; step 0 is a notice before
    the first (the CPU stand-in's label).
    """
    nvml = nvml or default_backend()
    gpus = nvml.read()
    device, backend = choose_device_and_backend(request.device, request.backend, gpus.available and bool(gpus.devices))
    pods = [name for name in request.scenarios if name != NCCL]
    if pods:
        check_can_make_pods()
    if pods and backend == CPU_STANDIN:
        progress(0, len(request.scenarios), f"{CPU_STANDIN_LABEL} ({gpus.reason or 'device cpu'})")
    config = replace(request.config, device=device, backend=backend)
    runs: list[ScenarioRun] = []
    nccl = None
    for number, name in enumerate(request.scenarios, 1):

        def say(line: str, number: int = number) -> None:
            progress(number, len(request.scenarios), line)

        if name == NCCL:
            nccl = run_nccl(request.ranks, request.device, request.out, say)
        else:
            runs.append(run_one(name, config, nvml, say))
    try:
        path = write_results(runs, request.out, command=request.command, gpus=gpus, nccl=nccl)
        report.build(request.out)
    except OSError as exc:
        raise GpuzombieError(f"cannot write the results to {request.out}/: {exc}") from exc
    return LabOutcome(runs=tuple(runs), results_path=path, gpus=gpus, standin=backend == CPU_STANDIN)
