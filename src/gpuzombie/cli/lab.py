"""`gpuzombie lab run` and `gpuzombie lab report`: the seed's experiment on one machine."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.nvml import default_backend
from gpuzombie.lab.pod import INITS
from gpuzombie.lab.report import build
from gpuzombie.lab.results import run_key, write_results
from gpuzombie.lab.scenarios import (
    SCENARIOS,
    LabConfig,
    ScenarioError,
    ScenarioRun,
    run_scenario,
)
from gpuzombie.workloads.memory import (
    BACKENDS,
    CPU_STANDIN,
    CPU_STANDIN_LABEL,
    DEVICES,
    torch_installed,
)

CHOICES = (*SCENARIOS, "nccl", "all")


@click.group()
def command() -> None:
    """Run the seed's scenarios as PID namespaces on this machine and write results/."""


def resolve(device: str, backend: str, gpus_available: bool) -> tuple[str, str]:
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


def run_nccl(ranks: int | None, device: str, out: Path, say: Any) -> dict[str, Any]:
    try:
        nccl = importlib.import_module("gpuzombie.lab.nccl")
        run_nccl_comparison = nccl.run_nccl_comparison
    except (ImportError, AttributeError) as exc:
        raise GpuzombieError(f"nccl scenario not available ({exc})") from exc
    return run_nccl_comparison(ranks=ranks, device=device, out_dir=out, cases=None,
                               observe_seconds=None, progress=say)


def exact_command() -> list[str]:
    """The command with every option spelled out (the defaults too), so it reruns the same way."""
    ctx = click.get_current_context()
    argv = ctx.command_path.split()
    for name, value in ctx.params.items():
        if value is not None:
            option = next(o for o in ctx.command.params if o.name == name)
            argv += [option.opts[0], str(value)]
    return argv


def summary_table(runs: list[ScenarioRun]) -> Table:
    table = Table(title="gpuzombie lab: deletion of each pod")
    for col in ("run", "PID 1", "zombies", "orphans", "delete→free", "whole grace", "GiB·s",
                "kill-9→free", "sampler CPU"):
        table.add_column(col, no_wrap=True)
    for r in runs:
        m = r.metrics
        obs = {o.point: o for o in r.observations}

        def secs(v: Any) -> str:
            return "—" if v is None else f"{v:.3f} s"

        table.add_row(run_key(r), r.init, str(obs["after-kill"].zombies), str(obs["after-spawn"].orphans),
                      secs(m["release_latency_s"]), "yes" if m["waited_whole_grace"] else "no",
                      f"{m['grace_waste_gib_s']:.2f}", secs(m["kill9_to_free_s"]),
                      f"{r.sampler['cpu_percent_of_one_core']}%")
    return table


@command.command("run")
@click.option("--scenario", type=click.Choice(CHOICES), default="all", show_default=True,
              help="One of the seed's scenarios, all four, or the NCCL comparison.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Workers alive at deletion (the parent spawns one more: the kill -9 victim).")
@click.option("--grace", type=click.FloatRange(0.5, 600), default=30.0, show_default=True,
              help="terminationGracePeriodSeconds, counted from the deletion (Kubernetes: 30).")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="How a GPU worker holds memory: torch, or the CUDA driver API (ctypes).")
@click.option("--uid", type=int, default=None, help="Run the workers as this uid (seed: 1000).")
@click.option("--size-mib", type=click.IntRange(1), default=2048, show_default=True,
              help="Memory each worker holds.")
@click.option("--init", "init", type=click.Choice([i for i in INITS if i != "sleep"]), default=None,
              help="Another init for S2-S4 (variants: tini-g, dumb-init).")
@click.option("--main", "main_process", type=click.Choice(["sleep", "worker"]), default="sleep",
              show_default=True,
              help="The container's main process under the init in S2-S4: sleep (experiments via "
                   "kubectl exec, the seed's way) or a worker that is the workload itself.")
@click.option("--ranks", type=int, default=None, help="NCCL ranks (--scenario nccl).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True)
def run_command(scenario: str, workers: int, grace: float, device: str, backend: str, uid: int | None,
                size_mib: int, init: str | None, main_process: str, ranks: int | None, out: Path) -> int:
    """Run scenario(s): start pod → parent spawns and exits → observe → kill -9 a worker →
    observe → delete (preStop, SIGTERM, SIGKILL at grace end) → observe; write OUT/."""
    console = Console(stderr=True, log_path=False)
    nvml = default_backend()
    gpus = nvml.read()
    device, backend = resolve(device, backend, gpus.available and bool(gpus.devices))
    if backend == CPU_STANDIN:
        console.print(f"[bold yellow]{CPU_STANDIN_LABEL}[/] ({gpus.reason or 'device cpu'})")
    config = LabConfig(workers=workers, grace=grace, device=device, backend=backend, size_mib=size_mib,
                       uid=uid, init=init, main=main_process)
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    runs: list[ScenarioRun] = []
    nccl = None
    with console.status("starting") as status:
        def say(line: str) -> None:
            console.log(line)
            status.update(line)

        for name in names:
            if name == "nccl":
                nccl = run_nccl(ranks, device, out, say)
                continue
            try:
                runs.append(run_scenario(SCENARIOS[name], config, nvml=nvml, progress=say))
            except ScenarioError as exc:
                raise GpuzombieError(str(exc)) from exc
    path = write_results(runs, out, command=exact_command(), gpus=gpus, nccl=nccl)
    if runs:
        out_console = Console()
        out_console.width = max(out_console.width, 120)
        out_console.print(summary_table(runs))
    console.print(f"wrote {path.parent}/ (comparison.md, results.json, memory-timeline.png)")
    left = [run_key(r) for r in runs if r.deletion.leftovers]
    if left:
        console.print(f"[red]processes left after deletion in: {', '.join(left)}[/]")
        return ExitStatus.FINDINGS
    return ExitStatus.OK


@command.command("report")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
def report_command(directory: Path) -> int:
    """Rebuild comparison.md, notes.md and the plots from DIRECTORY/results.json."""
    try:
        written = build(directory)
    except (OSError, ValueError, KeyError) as exc:
        raise GpuzombieError(f"cannot rebuild from {directory}/results.json: {exc}") from exc
    for path in written:
        click.echo(str(path))
    return ExitStatus.OK
