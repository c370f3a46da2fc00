"""`gpuzombie lab run`, `lab report` and the lab's other commands: the original experiment, on one machine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.status import Status
from rich.table import Table

from gpuzombie.cli.common import (
    CommandFn,
    choice_option,
    exact_command,
    image_archives_option,
    lab_out_option,
    shown_option,
)
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.lab.labrun import LabConfig, LabRun
from gpuzombie.lab.records import run_key
from gpuzombie.lab.report import build, format_seconds
from gpuzombie.lab.results import merge_results
from gpuzombie.lab.runner import NCCL, LabOutcome, LabRequest, NcclOptions, run_lab
from gpuzombie.lab.runtime.pidns import PID1_CHOICES
from gpuzombie.lab.scenarios import DEFAULT_SCENARIOS, RUNTIMES, SCENARIOS
from gpuzombie.workloads.memory import BACKENDS, DEVICES

CHOICES = (*SCENARIOS, NCCL, "all")


@click.group(short_help="Run the original experiment's scenarios as pods here and measure them.")
def command() -> None:
    """Run the original experiment's scenarios (and S5, shareProcessNamespace) as pods on this machine, PID
    namespaces, real CRI pods on containerd or real Pods on a single-node Kubernetes, and write their results."""


def summary_table(runs: list[LabRun]) -> Table:
    """One row per pod deletion: what the original experiment's observe.sh counted and what the grace cost."""
    table = Table(
        title="gpuzombie lab: deletion of each pod",
        caption="zombies: after the kill -9 of a worker; orphans: the parent's workers re-parented after it "
        "exited → left at the end; left after deletion: the pod's processes still there (exit 1)",
    )
    for col in (
        "run",
        "PID 1",
        "zombies\nafter kill -9",
        "orphans\nspawn → end",
        "left after\ndeletion",
        "delete →\nfree",
        "whole\ngrace",
        "GiB·s",
        "kill -9 →\nfree",
        "sampler\nCPU",
    ):
        table.add_column(col, no_wrap=True)
    for r in runs:
        m = r.metrics
        obs = {o.point: o for o in r.observations}
        table.add_row(
            run_key(r),
            r.init,
            str(obs["after-kill"].zombies),
            f"{obs['after-spawn'].orphans} → {obs['after-delete'].orphans}",
            str(len(r.deletion.leftovers)),
            format_seconds(m.release_latency_s),
            "yes" if m.waited_whole_grace else "no",
            f"{m.grace_waste_gib_s:.2f}",
            format_seconds(m.kill9_to_free_s),
            f"{r.sampler.cpu_percent_of_one_core}%",
        )
    return table


def _nccl_option(name: str, what: str, default: str | None, **kind: Any) -> Callable[[CommandFn], CommandFn]:
    """A knob of the NCCL comparison: None unless given, the runner then picks ``default`` (said in --help)."""
    said = f"  [default: {default}]" if default is not None else ""
    return click.option(name, default=None, help=f"{what} (--scenario nccl).{said}", **kind)


@command.command("run")
@click.option(
    "--scenario",
    type=click.Choice(CHOICES),
    multiple=True,
    default=("all",),
    show_default=True,
    help="A scenario (S1-S4 the original experiment's, S5 shareProcessNamespace, s4-fullfix-fasthook S4 with the fast "
    "hook), all five, or the NCCL comparison; repeat the option to run several side by side.",
)
@choice_option(
    "--runtime",
    [*RUNTIMES, "both", "all"],
    "namespaces",
    help="namespaces: PID namespaces made here; containerd: real CRI pods (a private containerd unless "
    "--cri-socket); kubernetes: Pods through the API server of `gpuzombie cluster` (the cluster up at "
    "$GPUZOMBIE_CLUSTER_DIR, left up; else one started for the run and stopped at its end); both: "
    "namespaces and containerd; all: the three; side by side in comparison.md.",
)
@click.option(
    "--cri-socket",
    type=click.Path(dir_okay=False),
    default=None,
    help="A running containerd's CRI socket to make the pods on.  [default: a private containerd per run]",
)
@shown_option(
    "--repeat",
    click.IntRange(1, 50),
    1,
    help="Run each scenario N times; comparison.md shows the median and min–max of each timing.",
)
@image_archives_option(
    "Import the pause and busybox images from these archives (made by `gpuzombie lab images`) "
    "instead of building them from this host's catatonit and busybox."
)
@shown_option(
    "--workers",
    click.IntRange(1, 64),
    1,
    help="Workers alive at deletion (the parent spawns one more: the kill -9 victim).",
)
@shown_option(
    "--grace",
    click.FloatRange(0.5, 600),
    30.0,
    help="terminationGracePeriodSeconds, counted from the deletion (Kubernetes: 30).",
)
@choice_option(
    "--device",
    DEVICES,
    "auto",
    help="cuda, or cpu: the labelled stand-in that holds host memory; auto: a GPU when NVML sees one.",
)
@choice_option(
    "--backend", BACKENDS, "auto", help="How a GPU worker holds memory: torch, or the CUDA driver API (ctypes)."
)
@click.option(
    "--uid",
    type=click.IntRange(0),
    default=None,
    help="Run the workers as this uid (the original experiment's: 1000).  [default: the lab's own]",
)
@shown_option(
    "--size-mib",
    click.IntRange(1),
    2048,
    help="Memory each worker holds. On the CPU stand-in the default is lowered to fit MemAvailable; "
    "a size given that does not fit is refused (exit 2). --scenario nccl: each rank's (default 2048 "
    "on GPUs, 64 on the stand-in).",
)
@click.option(
    "--init",
    "init",
    type=click.Choice([i for i in PID1_CHOICES if i != "sleep"]),
    default=None,
    help="PID 1 of S2-S4 instead of tini -s (variants: tini-g, dumb-init).",
)
@click.option(
    "--main",
    "main_process",
    type=click.Choice(["sleep", "worker"]),
    default="sleep",
    show_default=True,
    help="The container's main process under the init in S2-S4: sleep (experiments via "
    "kubectl exec, the original experiment's way) or a worker that is the workload itself.",
)
@_nccl_option("--ranks", "NCCL ranks", "one per GPU; 2 on the stand-in", type=click.IntRange(2))
@_nccl_option(
    "--cases",
    "NCCL cases to run side by side, from abcde (a defaults, b the original experiment's fix, c best knobs, "
    "d torchrun, e gpuzombie.graceful)",
    "abcde",
    metavar="LETTERS",
)
@_nccl_option(
    "--observe-seconds",
    "The NCCL window after the first kill",
    "420 on GPUs, 20 on the stand-in",
    type=click.FloatRange(min=1),
)
@_nccl_option(
    "--budget-seconds",
    "End the NCCL window early so the whole run fits this many seconds",
    None,
    type=click.FloatRange(min=1),
)
@_nccl_option(
    "--collective-timeout",
    "init_process_group(timeout=...) of NCCL cases b and c, in seconds",
    "10",
    type=click.FloatRange(min=0.1),
)
@lab_out_option("Where results.json, comparison.md, the plots and one folder per scenario go.")
def run_command(
    scenario: tuple[str, ...],
    runtime: str,
    cri_socket: str | None,
    repeat: int,
    image_archives: Path | None,
    workers: int,
    grace: float,
    device: str,
    backend: str,
    uid: int | None,
    size_mib: int,
    init: str | None,
    main_process: str,
    ranks: int | None,
    cases: str | None,
    observe_seconds: float | None,
    budget_seconds: float | None,
    collective_timeout: float | None,
    out: Path,
) -> int:
    """Run the original experiment's scenarios as pods on this machine and write OUT/.

    \b
    Each scenario: start the pod -> the parent spawns its workers and exits
    -> observe -> kill -9 a worker -> observe -> delete the pod (preStop,
    SIGTERM, SIGKILL when the grace ends) -> observe.

    \b
    --runtime containerd: each pod a CRI sandbox + container on a private
    containerd (or --cri-socket), deleted with the kubelet's calls:
    preStop by ExecSync, StopContainer, StopPodSandbox, RemovePodSandbox.

    \b
    --runtime kubernetes: each pod a Pod on the real single-node cluster
    (gpuzombie cluster), created with kubectl apply and deleted with
    kubectl delete --grace-period: the kubelet runs preStop, SIGTERM and
    the SIGKILL at the grace's end. It uses the cluster up at
    $GPUZOMBIE_CLUSTER_DIR (instance $GPUZOMBIE_CLUSTER_INSTANCE) and
    leaves it up; with none up there it starts one and stops it at the
    end. On a GPU (--device cuda) the cluster must be up with a device
    plugin that advertises nvidia.com/gpu (scripts/device/kube_gpu.sh):
    the kubelet allocates each pod's GPU.

    \b
    --scenario nccl: N ranks in collectives, rank 0 SIGKILLed, the five
    cases (--cases) compared side by side in one window (docs/nccl.md).

    \b
    Exit codes: 0 every pod left nothing behind (and every NCCL case ran),
    1 processes were left after a deletion or an NCCL case failed to
    start, 2 usage or environment error, a failed CRI or kubectl call, or
    a cluster component (kubelet, API server...) gone mid-run (named),
    130 interrupted (Ctrl-C or SIGTERM stops the pods, the NCCL ranks, a
    private containerd and a cluster the run started; nothing is left
    running).
    """
    console = Console(stderr=True, log_path=False)
    size_given = click.get_current_context().get_parameter_source("size_mib") is not ParameterSource.DEFAULT
    config = LabConfig(workers=workers, grace=grace, size_mib=size_mib, uid=uid, init=init, main=main_process)
    request = LabRequest(
        scenarios=list(dict.fromkeys(n for name in scenario for n in (DEFAULT_SCENARIOS if name == "all" else [name]))),
        config=config,
        out=out,
        command=exact_command(),
        device=device,
        backend=backend,
        ranks=ranks,
        runtimes={"both": RUNTIMES[:2], "all": RUNTIMES}.get(runtime, (runtime,)),
        repeat=repeat,
        cri_socket=cri_socket,
        image_archives=image_archives,
        scale_to_memory=not size_given,
        nccl=NcclOptions(cases, observe_seconds, budget_seconds, collective_timeout, size_mib if size_given else None),
    )
    with console.status("starting") as status:
        outcome = run_lab(request, progress=_steps(console, status))
    return _report(console, outcome)


def _steps(console: Console, status: Status) -> Callable[[int, int, str], None]:
    """A progress line: step 0 a note, the others logged with their number and shown as the status."""

    def say(step: int, steps: int, line: str) -> None:
        if step == 0:
            console.print(f"[bold yellow]{line}[/]")
            return
        prefix = f"[{step}/{steps}] " if steps > 1 else ""
        console.log(prefix + line)
        status.update(prefix + line)

    return say


def _report(console: Console, outcome: LabOutcome) -> int:
    """The runs' table (and the NCCL cases'), where they were written, and the exit code."""
    runs, path = list(outcome.runs), outcome.results_path
    if runs:
        out_console = Console()
        out_console.width = max(out_console.width, 132)  # a pipe's 80 columns would cut the table
        out_console.print(summary_table(runs))
    if outcome.nccl is not None:
        from gpuzombie.lab.nccl.report import terminal_table

        out_console = Console()
        out_console.width = max(out_console.width, 150)  # a file or a pipe gets 80 columns by default: too narrow
        out_console.print(terminal_table(outcome.nccl))
    console.print(
        f"wrote {path.parent}/ (comparison.md, results.json" + (", memory-timeline.png)" if runs else ", nccl/)")
    )
    left = [run_key(r) for r in runs if r.deletion.leftovers]
    if left:
        console.print(f"[red]processes left after deletion in: {', '.join(left)}[/]")
    failed = [c.case for c in (outcome.nccl.cases if outcome.nccl else ()) if c.error]
    if failed:
        console.print(f"[red]NCCL case(s) that failed to start: {', '.join(failed)}[/]")
    return ExitStatus.FINDINGS if left or failed else ExitStatus.OK


@command.command("images", short_help="Write the lab's pause and busybox images as archives to carry.")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def images_command(directory: Path) -> int:
    """Write pause.tar (catatonit -P) and busybox.tar into DIRECTORY, for `lab run --runtime
    containerd --image-archives DIRECTORY` on a machine without catatonit or busybox-static.

    \b
    Exit codes: 0 written, 2 catatonit or busybox missing here, or DIRECTORY not writable.
    """
    try:
        from gpuzombie.lab.runtime.containerd import ContainerdError
        from gpuzombie.lab.runtime.cri import write_image_archives
    except ImportError as exc:
        raise GpuzombieError(needs_extra("lab images", "node", exc)) from exc
    try:
        written = write_image_archives(directory)
    except (OSError, ContainerdError) as exc:
        raise GpuzombieError(f"cannot write the images to {directory}/: {exc}") from exc
    for path in written:
        click.echo(str(path))
    return ExitStatus.OK


@command.command("merge", short_help="Merge lab runs made in separate calls into one results folder.")
@click.argument("destination", type=click.Path(file_okay=False, path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
def merge_command(destination: Path, sources: tuple[Path, ...]) -> int:
    """Merge each SOURCE's results.json and scenario folders into DESTINATION (runs with the same
    name are replaced), then rebuild its comparison.md, notes and plots.

    \b
    Exit codes: 0 merged, 2 a results.json missing, unreadable or of another kind.
    """
    try:
        merge_results(destination, sources)
        written = build(destination)
    except (OSError, ValueError, KeyError) as exc:
        raise GpuzombieError(f"cannot merge into {destination}/: {exc}") from exc
    click.echo(f"{destination}/: {len(written)} files rebuilt")
    return ExitStatus.OK


@command.command("report", short_help="Rebuild comparison.md, notes and plots from results.json.")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
def report_command(directory: Path) -> int:
    """Rebuild comparison.md, each scenario's notes.md and the plots from DIRECTORY/results.json,
    without running anything (after a change to the report, or on results copied from a GPU run).

    \b
    Exit codes: 0 rebuilt, 2 DIRECTORY/results.json missing or unreadable.
    """
    try:
        written = build(directory)
    except (OSError, ValueError, KeyError) as exc:
        raise GpuzombieError(f"cannot rebuild from {directory}/results.json: {exc}") from exc
    for path in written:
        click.echo(str(path))
    return ExitStatus.OK


@command.command("clean", short_help="Remove what lab runs that died (SIGKILL, OOM) left behind.")
@click.option("--dry-run", is_flag=True, help="Only list what dead runs left; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema gpuzombie.labclean/1).")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the lab's runs keep their state (default /run/gpuzombie-lab).",
)
def clean_command(dry_run: bool, as_json: bool, state_dir: Path | None) -> int:
    """Find the lab's runs (private containerds of `lab pod`, `lab run --runtime containerd` and
    the tests) whose owner process is gone, and remove what each left: its containerd, shims, pause
    and container processes (each signalled through a pidfd checked against its start time, never
    a reused pid), its mounts, the pod cgroups it made, its shim sockets and its directory. Runs
    whose owner still runs are not touched. It returns once each process it killed is gone (exited
    and reaped), or after 10 s, naming each that is not. `lab pod` does the same at its start.

    \b
    Exit codes: 0 nothing left (or all of it removed),
    1 something found (--dry-run), something not removable, or a killed process not gone in 10 s,
    2 not root.
    """
    import json
    import os
    from dataclasses import asdict

    from gpuzombie.lab.runtime.rundirs import LAB_STATE_ROOT, clean_dead_runs

    if os.geteuid() != 0:
        raise GpuzombieError("lab clean needs root (it stops containerd, shims and containers, and unmounts)")
    found = clean_dead_runs(state_dir or LAB_STATE_ROOT, dry_run=dry_run)
    if as_json:
        runs = [asdict(r) for r in found]
        click.echo(json.dumps({"schema": "gpuzombie.labclean/1", "dry_run": dry_run, "runs": runs}))
    for r in found if not as_json else ():
        what = (
            f"{len(r.processes)} process(es), {len(r.mounts)} mount(s), {len(r.cgroups)} cgroup(s), "
            f"{len(r.shim_sockets)} shim socket(s)"
        )
        verb = "would remove" if dry_run else ("removed" if r.removed and not r.problems else "could not remove all of")
        click.echo(f"{verb} {r.path} (owner pid {r.owner_pid} gone): {what}")
        for problem in r.problems:
            click.echo(f"  {problem}")
    if not found and not as_json:
        click.echo("nothing left by a dead lab run")
    failed = any(r.problems or not r.removed for r in found) if not dry_run else bool(found)
    return ExitStatus.FINDINGS if failed else ExitStatus.OK


HANDOVER_DEVICE = (
    "cpu: the GPU is a labelled stand-in (host memory, a stand-in /dev/nvidia0 and NVML file); cuda: GPU 0."
)


@command.command("handover", short_help="Pod B after a stale GPU holder: without the preflight gate, and with it.")
@choice_option("--device", ("cpu", "cuda"), "cpu", help=HANDOVER_DEVICE)
@click.option(
    "--size-mib", type=click.IntRange(1), help="What pod A's holder holds.  [default: 64 on cpu, 2048 on cuda]"
)
@shown_option("--repeat", click.IntRange(1, 50), 1, help="Runs of the experiment.")
@shown_option(
    "--reap-after",
    click.FloatRange(min=0),
    8.0,
    help="Seconds the gated pod B waits before `gpuzombie reap --yes` ends the holder.",
)
@click.option(
    "--budget-seconds", type=click.FloatRange(min=1), default=None, help="Start no run after this many seconds."
)
@image_archives_option(
    "Import the pause and busybox images from these archives (made by `gpuzombie lab images`) "
    "instead of building them from this host's catatonit and busybox."
)
@shown_option(
    "--out",
    click.Path(file_okay=False, path_type=Path),
    Path("lab-handover"),
    help="Where handover.json, gate-<n>.log and pod A's worker logs a-<n>.log go.",
)
@click.option("--json", "as_json", is_flag=True, help="Print handover.json's object instead of its summary.")
def handover_command(
    device: str,
    size_mib: int | None,
    repeat: int,
    reap_after: float,
    budget_seconds: float | None,
    image_archives: Path | None,
    out: Path,
    as_json: bool,
) -> int:
    """The handover gate on this machine's private containerd (docs/handover.md): pod A leaves a
    stale holder (a worker that outlives its pod); pod B as written starts beside it; pod B as the
    webhook patches it with --preflight waits, its gate reporting the holder, until `gpuzombie reap
    --yes` ends the holder; then B's workload starts. Measured: reap → free, free → B running (and on
    a GPU, free → NVML lists B's worker). Needs root.

    \b
    Exit codes: 0 every run as the gate promises, 1 a run that was not (or none ran),
    2 could not run (not root, no containerd, the node extra missing).
    """
    import json
    import time

    try:  # grpcio and the CRI stubs are an extra
        from gpuzombie.k8s.cri import CriError
        from gpuzombie.lab.handover import run_handover
    except ImportError as exc:
        raise GpuzombieError(needs_extra("lab handover", "node", exc)) from exc

    def say(line: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {line}", err=True)

    size = size_mib or (2048 if device == "cuda" else 64)
    try:
        summary = run_handover(
            out, device=device, size_mib=size, repeat=repeat, reap_after_s=reap_after, budget_s=budget_seconds,
            archives=image_archives, say=say,
        )  # fmt: skip
    except CriError as exc:  # a LabError is a GpuzombieError already
        raise GpuzombieError(str(exc)) from exc
    except OSError as exc:
        raise GpuzombieError(f"cannot write to {out}/: {exc}") from exc
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(json.dumps(summary["spread"], indent=1))
        click.echo(f"handover gate on {device}: {'OK' if summary['ok'] else 'NOT AS EXPECTED'} (wrote {out}/)")
    return ExitStatus.OK if summary["ok"] else ExitStatus.FINDINGS


def _register_pod() -> None:
    """``lab pod`` lives in its own module (cli/labpod.py)."""
    from gpuzombie.cli.labpod import pod_command

    command.add_command(pod_command)


_register_pod()
