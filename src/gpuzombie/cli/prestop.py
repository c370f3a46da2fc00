"""`gpuzombie prestop`: the preStop hook. SIGTERM the pod's GPU holders and orphans, wait, SIGKILL.

The same run as ``python3 -m gpuzombie.prestop`` (stdlib only, faster to start in a hook)."""

from __future__ import annotations

import click

from gpuzombie.cli.common import json_option, procfs_option
from gpuzombie.prestop import DEFAULT_KILL_WAIT, DEFAULT_TIMEOUT
from gpuzombie.prestop.hook import run_hook


@click.command()
@click.option(
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    envvar="GPUZOMBIE_PRESTOP_TIMEOUT",
    help="Seconds between SIGTERM and SIGKILL. With --kill-wait it must fit the pod's "
    "terminationGracePeriodSeconds (the hook's time counts against it).",
)
@click.option(
    "--kill-wait",
    type=float,
    default=DEFAULT_KILL_WAIT,
    show_default=True,
    help="Seconds to wait for processes to vanish after SIGKILL before calling them survivors.",
)
@click.option("--dry-run", is_flag=True, help="List the targets; signal nothing, write nothing to PID 1's stdout.")
@click.option("--no-orphans", is_flag=True, help="Stop only GPU holders, not other orphans.")
@click.option("--no-nvml", is_flag=True, help="Do not ask NVML (the /dev/nvidia* fd scan still runs).")
@click.option(
    "--same-cgroup", is_flag=True, help="Only processes in this process's own cgroup (pods with shareProcessNamespace)."
)
@click.option(
    "--cgroup",
    metavar="PATH",
    help="Only processes in this cgroup or below it, as /proc/<pid>/cgroup shows it. "
    "In the host PID namespace this or --container is required.",
)
@click.option(
    "--container",
    metavar="ID",
    help="Only this container's processes: its id, a prefix of 12+ hex digits, or runtime://<id>.",
)
@click.option(
    "--pid1-log/--no-pid1-log",
    default=True,
    show_default=True,
    envvar="GPUZOMBIE_PRESTOP_PID1_LOG",
    help="Also write the log lines to /proc/1/fd/1, so they reach `kubectl logs`.",
)
@json_option
@procfs_option
def command(
    timeout: float,
    kill_wait: float,
    dry_run: bool,
    no_orphans: bool,
    no_nvml: bool,
    same_cgroup: bool,
    cgroup: str | None,
    container: str | None,
    pid1_log: bool,
    as_json: bool,
    procfs: str,
) -> int:
    """Stop every GPU-holding process and orphan of this container, before the kubelet's SIGKILL.

    Run it inside the pod's PID namespace (as a preStop exec hook); in the host's PID namespace
    it acts only on --cgroup or --container and refuses otherwise. Signals go through pidfds only.
    Exit 0: every target is gone (or there was none); 1: something survived SIGKILL, or some
    process could not be read; 2: usage or environment error, or the host namespace without a
    scope; 130: interrupted.
    """
    return run_hook(
        procfs=procfs,
        timeout=timeout,
        kill_wait=kill_wait,
        dry_run=dry_run,
        include_orphans=not no_orphans,
        same_cgroup=same_cgroup,
        cgroup=cgroup,
        container=container,
        use_nvml=not no_nvml,
        pid1_log=pid1_log,
        as_json=as_json,
    )
