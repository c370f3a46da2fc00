"""A whole ``lab run`` as a library call: choose the device, run the scenarios, write and render.

The CLI parses options into a ``LabRequest`` and renders the ``LabOutcome``; everything between
(the device choice, the checks before the first pod, the run loop, results.json, the report) is
here, so a library user runs the lab without click.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.gpu.nvml import GpuSnapshot, NvmlBackend, default_backend
from gpuzombie.lab import report
from gpuzombie.lab.host_memory import fit_to_memory
from gpuzombie.lab.labrun import LabConfig, LabRun
from gpuzombie.lab.nccl.summary import NcclSummary
from gpuzombie.lab.results import write_results
from gpuzombie.lab.scenarios import SCENARIOS, run_scenario
from gpuzombie.proc.own import mem_available
from gpuzombie.workloads.memory import CPU_STANDIN, CPU_STANDIN_LABEL, torch_installed

if TYPE_CHECKING:
    from gpuzombie.lab.runtime.cri import CriRuntime
    from gpuzombie.lab.runtime.kube import KubeRuntime

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
class NcclOptions:
    """The NCCL comparison's own knobs (``--scenario nccl``); None: its default."""

    cases: str | None = None
    """Which of the cases a-e run side by side (``abcde``: all)."""
    observe_seconds: float | None = None
    """The window after the first kill (420 s on GPUs, 20 s on the stand-in)."""
    budget_seconds: float | None = None
    """End the window early so the whole run fits this many seconds (a device call's limit)."""
    collective_timeout_s: float | None = None
    """``init_process_group(timeout=...)`` of cases b and c (10 s)."""
    size_mib: int | None = None
    """Memory each rank holds (2048 MiB on GPUs, 64 on the stand-in)."""

    def given(self) -> list[str]:
        """The options set, as the CLI spells them."""
        return [option for name, option in NCCL_OPTIONS.items() if getattr(self, name) is not None]


NCCL_OPTIONS = {
    "cases": "--cases",
    "observe_seconds": "--observe-seconds",
    "budget_seconds": "--budget-seconds",
    "collective_timeout_s": "--collective-timeout",
    "size_mib": "--size-mib",
}
"""Each of ``NcclOptions``' fields and its option of ``gpuzombie lab run``."""


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
    runtimes: Sequence[str] = ("namespaces",)
    repeat: int = 1
    cri_socket: str | None = None
    """A running CRI runtime's socket; without it the containerd runtime is a private one per run."""
    image_archives: Path | None = None
    """Pause and busybox image archives to import (a machine that cannot build them)."""
    scale_to_memory: bool = False
    """The size was not chosen: on the CPU stand-in, lower it to fit MemAvailable (else refuse)."""
    nccl: NcclOptions = NcclOptions()


@dataclass(frozen=True)
class LabOutcome:
    runs: tuple[LabRun, ...]
    results_path: Path
    gpus: GpuSnapshot
    standin: bool
    """The scenarios ran on the CPU stand-in (host memory, no GPU)."""
    nccl: NcclSummary | None = None
    """The NCCL comparison's results, when it ran."""


def run_nccl(ranks: int | None, device: str, out: Path, progress: Progress, options: NcclOptions) -> NcclSummary:
    """The NCCL comparison; ``device`` as given (``auto`` falls back to gloo below 2 GPUs)."""
    try:  # imported here: only this scenario needs it, and a trimmed install may lack it
        from gpuzombie.lab.nccl import run_nccl_comparison
        from gpuzombie.lab.nccl.cases import DEFAULT_COLLECTIVE_TIMEOUT_S
    except ImportError as exc:
        raise GpuzombieError(f"nccl scenario not available ({exc})") from exc
    return run_nccl_comparison(
        ranks=ranks,
        device=device,
        out_dir=out,
        cases=list(options.cases) if options.cases is not None else None,
        observe_seconds=options.observe_seconds,
        progress=progress,
        size_mib=options.size_mib,
        collective_timeout_s=options.collective_timeout_s or DEFAULT_COLLECTIVE_TIMEOUT_S,
        budget_s=options.budget_seconds,
    )


def run_one(
    scenario: str,
    config: LabConfig,
    nvml: NvmlBackend,
    progress: Progress,
    runtime: CriRuntime | KubeRuntime | None = None,
    attempt: int = 1,
) -> LabRun:
    """One scenario; a pod that cannot start or a workload that fails raises a ``LabError``, which
    the CLI prints as one line."""
    return run_scenario(SCENARIOS[scenario], config, nvml=nvml, progress=progress, runtime=runtime, attempt=attempt)


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM stops the run like Ctrl-C (every ``finally`` removes its pods); while that clean-up
    runs, further SIGINT and SIGTERM are ignored so that it cannot be cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt), signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])


@contextlib.contextmanager
def lab_runtime(
    request: LabRequest, runtime: str, gpu: bool, progress: Progress = lambda _: None
) -> Iterator[CriRuntime | KubeRuntime | None]:
    """Nothing for PID namespaces; a CRI runtime (private containerd, or ``--cri-socket``) for
    containerd; the cluster (one that is up, or one started for the run) for kubernetes."""
    if runtime == "namespaces":
        yield None
        return
    if runtime == "kubernetes":
        try:  # grpcio and the CRI stubs (the node's containerd is asked for pids): the node extra
            from gpuzombie.lab.runtime.kube import kube_runtime
        except ImportError as exc:
            raise GpuzombieError(needs_extra("--runtime kubernetes", "node", exc)) from exc
        with kube_runtime(progress=progress, gpu=gpu) as kube:
            yield kube
        return
    try:  # grpcio and the CRI stubs are an extra
        from gpuzombie.k8s.cri import CriError
        from gpuzombie.lab.runtime.containerd import ContainerdError
        from gpuzombie.lab.runtime.cri import cri_runtime
    except ImportError as exc:
        raise GpuzombieError(needs_extra("--runtime containerd", "node", exc)) from exc
    try:
        with cri_runtime(socket=request.cri_socket, gpu=gpu, archives=request.image_archives) as cri:
            yield cri
    except (CriError, ContainerdError) as exc:
        raise GpuzombieError(str(exc)) from exc


def with_option(argv: Sequence[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option``'s value replaced (or the option added when it is not there)."""
    out = list(argv)
    if option in out[:-1]:
        out[out.index(option) + 1] = value
        return out
    return [*out, option, value]


def check_request(request: LabRequest) -> None:
    """What the runtimes cannot do, in one line before anything starts."""
    whole_seconds = {"containerd": "the CRI", "kubernetes": "terminationGracePeriodSeconds"}
    for runtime, why in whole_seconds.items():
        if runtime in request.runtimes and request.config.grace != int(request.config.grace):
            raise GpuzombieError(f"--runtime {runtime}: {why} takes the grace in whole seconds (use --grace 2, 30...)")
    if set(request.runtimes) - {"namespaces"} and request.config.uid is not None:
        raise GpuzombieError("--uid: only on the namespaces runtime")
    nccl_only = [o for o in request.nccl.given() if o != "--size-mib"]
    if nccl_only and NCCL not in request.scenarios:
        raise GpuzombieError(f"{', '.join(nccl_only)}: only with --scenario nccl")


def run_lab(
    request: LabRequest,
    *,
    nvml: NvmlBackend | None = None,
    progress: Callable[[int, int, str], None] = lambda _n, _total, _line: None,
) -> LabOutcome:
    """Run every requested scenario on every runtime, ``repeat`` times, write OUT/results.json and
    render the report. Ctrl-C or SIGTERM at any point: every pod (and a private containerd) is
    removed before KeyboardInterrupt propagates, and the runs finished by then are in results.json.

    ``progress(step, steps, line)`` reports each step as it happens; step 0 is a notice before
    the first (the CPU stand-in's label).
    """
    check_request(request)
    nvml = nvml or default_backend()
    gpus = nvml.read()
    device, backend = choose_device_and_backend(request.device, request.backend, gpus.available and bool(gpus.devices))
    pods = [name for name in request.scenarios if name != NCCL]
    if pods:
        check_can_make_pods()
    command = list(request.command)
    base = request.config
    if pods and backend == CPU_STANDIN:
        progress(0, len(request.scenarios), f"{CPU_STANDIN_LABEL} ({gpus.reason or 'device cpu'})")
        base, note = fit_to_memory(base, mem_available(), scale=request.scale_to_memory)
        if note:
            progress(0, len(request.scenarios), note)
        command = with_option(command, "--size-mib", str(base.size_mib))  # rerunnable as it ran
    steps = len(pods) * request.repeat * len(request.runtimes) + (NCCL in request.scenarios)
    step = 0
    runs: list[LabRun] = []
    nccl = None

    def say(line: str) -> None:
        progress(step, steps, line)

    def write(nccl: NcclSummary | None = None) -> Path:
        try:
            return write_results(runs, request.out, command=command, gpus=gpus, nccl=nccl)
        except OSError as exc:
            raise GpuzombieError(f"cannot write the results to {request.out}/: {exc}") from exc

    try:
        with interrupts_as_keyboard_interrupt():
            for runtime in request.runtimes if pods else ():
                config = replace(base, device=device, backend=backend, runtime=runtime)
                with lab_runtime(request, runtime, gpu=device == "cuda", progress=say) as cri:
                    for attempt in range(1, request.repeat + 1):
                        for name in pods:
                            step += 1
                            runs.append(run_one(name, config, nvml, say, cri, attempt))
                            write()  # every finished run is kept, even if a later one is interrupted
            if NCCL in request.scenarios:
                step += 1
                nccl = run_nccl(request.ranks, request.device, request.out, say, request.nccl)
    except KeyboardInterrupt:
        if runs:
            report.build(request.out)
        raise
    path = write(nccl)
    report.build(request.out)
    return LabOutcome(runs=tuple(runs), results_path=path, gpus=gpus, standin=backend == CPU_STANDIN, nccl=nccl)
