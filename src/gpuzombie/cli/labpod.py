"""`gpuzombie lab pod FILE|-`: a Pod manifest on the lab's containerd, deleted as the kubelet deletes it."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from gpuzombie.cli.common import choice_option, image_archives_option, lab_out_option, shown_option
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console
    from rich.status import Status

    from gpuzombie.gpu.nvml import NvmlBackend
    from gpuzombie.lab.labrun import LabRun
    from gpuzombie.lab.manifest import PodManifest
    from gpuzombie.lab.podrun import PodRunConfig
    from gpuzombie.lab.runtime.manifestpod import HostPathGrant

SCHEMA = "gpuzombie.labpod/2"


def load_manifest(stream: IO[str]) -> Any:
    """The one Pod of a YAML (or JSON) stream, as parsed data; GpuzombieError for anything else."""
    try:
        import yaml  # noqa: F401 -- the labpod extra
    except ImportError as exc:
        raise GpuzombieError(needs_extra("lab pod", "labpod", exc)) from exc
    from gpuzombie.lab.manifest import ManifestError, load_pod

    name = getattr(stream, "name", "<stdin>")  # click's stdin may be any text stream
    shown = "stdin" if name == "<stdin>" else str(name)
    try:
        text = stream.read()
    except UnicodeDecodeError as exc:  # a binary file: before, "internal error: UnicodeDecodeError"
        raise GpuzombieError(f"{shown}: not UTF-8 text (byte {exc.start + 1}), so not a Pod manifest") from exc
    except OSError as exc:
        raise GpuzombieError(f"cannot read {shown}: {exc.strerror or exc}") from exc
    try:
        return load_pod(text)
    except ManifestError as exc:
        raise GpuzombieError(f"{shown}: {exc}") from exc


def host_path_grant_of(value: str) -> HostPathGrant:
    """``PATH`` or ``PATH:rw`` (``PATH:ro`` too) of --allow-host-path; an absolute path is needed."""
    from gpuzombie.lab.runtime.manifestpod import HostPathGrant

    path, _, mode = value.rpartition(":") if value.endswith((":rw", ":ro")) else (value, "", "ro")
    if not os.path.isabs(path):
        raise GpuzombieError(f"--allow-host-path {value}: an absolute path is needed")
    return HostPathGrant(os.path.normpath(path), writable=mode == "rw")


def _say(console: Console, status: Status) -> Callable[[str], None]:
    """A progress line: logged, and shown as the spinner's status."""

    def say(line: str) -> None:
        console.log(line)
        status.update(line)

    return say


@click.command(
    "pod", short_help="Run a Pod manifest on the lab's containerd (or the cluster) and measure its deletion."
)
@click.argument("manifest", type=click.File("r"))
@choice_option(
    "--runtime",
    ["containerd", "kubernetes"],
    "containerd",
    help="containerd: a private containerd, the kubelet's CRI calls made by the lab; kubernetes: the "
    "manifest kubectl apply'd to `gpuzombie cluster` (the cluster up at $GPUZOMBIE_CLUSTER_DIR, left "
    "up; else one started for the run and stopped at its end) and deleted through its API server.",
)
@click.option(
    "--grace",
    type=click.IntRange(0, 600),
    default=None,
    help="terminationGracePeriodSeconds instead of the manifest's (whole seconds, as the CRI takes it).",
)
@choice_option(
    "--device",
    ["auto", "cuda", "cpu"],
    "auto",
    help="cuda: GPU containers get the GPU's devices; cpu: none (the labelled stand-in: host memory); "
    "auto: cuda when NVML sees a GPU.",
)
@image_archives_option("Import the pause and busybox images from these archives (`gpuzombie lab images`).")
@shown_option(
    "--repeat",
    click.IntRange(1, 20),
    1,
    help="Run the pod N times (one containerd); the report shows each run.",
)
@shown_option(
    "--ready-timeout",
    click.FloatRange(1, 3600),
    180.0,
    help="Measure the pod after this long even if it never settles (its processes, memory held and "
    "none of them running unchanged for a second).",
)
@click.option(
    "--allow-host-path",
    "host_paths",
    metavar="PATH[:rw]",
    multiple=True,
    help="Let hostPath volumes at or under PATH be bound (repeatable); read-only unless :rw and the "
    "volumeMount is not readOnly. Without it every hostPath is refused: the manifest runs as root.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print each run as one line of JSON (schema gpuzombie.labpod/2, docs/lab.md).",
)
@lab_out_option("Where results.json, comparison.md, the plots and the pod's folder go (lab run's layout).")
def pod_command(
    manifest: IO[str],
    runtime: str,
    grace: int | None,
    device: str,
    image_archives: Path | None,
    repeat: int,
    ready_timeout: float,
    host_paths: tuple[str, ...],
    as_json: bool,
    out: Path,
) -> int:
    """Run the Pod in MANIFEST (a file, or - for stdin) on a private containerd as the kubelet
    would, delete it as the kubelet does, and measure it like the scenarios.

    \b
    Start: volumes (emptyDir, medium Memory a tmpfs; hostPath only where
    --allow-host-path allows it, read-only unless :rw), RunPodSandbox (its own
    network namespace with lo only; seccomp RuntimeDefault unless the manifest
    says Unconfined; no NET_RAW),
    each init container to completion, then the containers. Delete: every
    container's preStop (exec by ExecSync, or sleep) within the grace, then
    StopContainer with the seconds left (at least 2), then the sandbox.
    Every image runs as the lab's (busybox with the host's directories; its
    ENTRYPOINT is empty), so a container runs command + args. A field the lab
    cannot apply is refused by name; those without effect on a lab node
    (pull secrets, scheduling, probes) are listed.

    \b
    --runtime kubernetes: the manifest is kubectl apply'd to the real
    single-node cluster, unpatched but for what a node without a registry
    needs (listed before the pod starts: the lab's image, the host's
    directories as read-only hostPath volumes, no nvidia.com/gpu on the CPU
    stand-in); kubectl delete --grace-period deletes it and the kubelet runs
    the preStop hook, SIGTERM and SIGKILL. On a GPU the cluster must be up
    with a device plugin that advertises nvidia.com/gpu.

    \b
    Exit codes: 0 the pod was gone within the grace and left nothing,
    1 it waited the whole grace (SIGKILL at its end) or left processes,
    2 usage error, an unsupported field, or an environment error,
    130 interrupted (the pod and containerd are removed).
    """
    from rich.console import Console
    from rich.text import Text

    from gpuzombie.cli.common import exact_command
    from gpuzombie.lab.manifest import ManifestError, parse_pod

    doc = load_manifest(manifest)
    where = getattr(manifest, "name", "stdin")
    try:
        parsed = parse_pod(doc)
    except ManifestError as exc:
        raise GpuzombieError(f"{where}: {exc}") from exc
    try:  # grpcio and the CRI stubs are an extra
        from gpuzombie.k8s.cri import CriError
        from gpuzombie.lab.errors import LabError
        from gpuzombie.lab.podrun import lab_notes, run_lab_pod
    except ImportError as exc:
        raise GpuzombieError(needs_extra("lab pod", "labpod", exc)) from exc
    nvml, config = _config(parsed, where, device, grace, ready_timeout, host_paths, runtime)
    console = Console(stderr=True, log_path=False)
    for note in lab_notes(parsed, config) if runtime == "containerd" else ():
        console.print(Text.assemble(("lab pod:", "yellow"), " ", escape(note, 1000)))  # a hostPath is the manifest's
    run = functools.partial(run_lab_pod, parsed, config, out=out, command=exact_command(), document=doc)
    try:
        with console.status("starting") as status:
            runs, path = run(
                archives=image_archives, nvml=nvml, progress=_say(console, status), repeat=repeat, runtime=runtime
            )
    except (CriError, LabError) as exc:
        raise GpuzombieError(str(exc)) from exc
    except OSError as exc:
        raise GpuzombieError(f"cannot write the results to {out}/: {exc}") from exc
    findings = _echo_runs(runs, as_json=as_json)
    from gpuzombie.lab.records import run_key

    console.print(f"wrote {path.parent}/ ({', '.join(run_key(r) for r in runs)}, comparison.md, results.json)")
    return ExitStatus.FINDINGS if findings else ExitStatus.OK


def _config(
    parsed: PodManifest,
    where: str,
    device: str,
    grace: int | None,
    ready_timeout: float,
    host_paths: tuple[str, ...],
    runtime: str,
) -> tuple[NvmlBackend, PodRunConfig]:
    """NVML and the run's configuration, checked against the manifest before anything is made."""
    from gpuzombie.gpu.nvml import default_backend
    from gpuzombie.lab.errors import LabError
    from gpuzombie.lab.podrun import PodRunConfig, check_runnable
    from gpuzombie.lab.runner import choose_device_and_backend

    nvml = default_backend()
    gpus = nvml.read()
    resolved, _backend = choose_device_and_backend(device, "auto", gpus.available and bool(gpus.devices))
    grants = tuple(host_path_grant_of(value) for value in host_paths)
    config = PodRunConfig(device=resolved, grace=grace, ready_timeout=ready_timeout, host_paths=grants)
    try:
        check_runnable(parsed, config, runtime)  # before anything is made, and before the notes
    except LabError as exc:
        raise GpuzombieError(f"{where}: {exc}") from exc
    return nvml, config


def _echo_runs(runs: list[LabRun], *, as_json: bool) -> bool:
    """One line a run (JSON, or a sentence); whether any left processes or waited the whole grace."""
    from gpuzombie.lab.records import RunRecord

    findings = False
    for run in runs:
        record = RunRecord.of(run)
        key = record.key
        m, d = run.metrics, run.deletion
        before = next((o for o in run.observations if o.point == "after-spawn"), None)
        findings = findings or bool(d.leftovers) or bool(m.waited_whole_grace)
        if as_json:
            click.echo(json.dumps({"schema": SCHEMA, "run": key, **record.to_json()}, default=str))
            continue
        free = "—" if m.release_latency_s is None else f"{m.release_latency_s:.3f} s"
        click.echo(
            f"{key}: PID 1 {run.init}; zombies {before.zombies if before else 0}, orphans "
            f"{before.orphans if before else 0} before deletion; deletion → free {free}; whole grace "
            f"({d.grace_s:g} s) waited: {'yes' if m.waited_whole_grace else 'no'}; grace waste "
            f"{m.grace_waste_gib_s:.2f} GiB·s; processes left: {len(d.leftovers)}"
        )
    return findings
