"""`gpuzombie prestop`: the preStop hook. SIGTERM the pod's GPU holders and orphans, wait, SIGKILL."""

from __future__ import annotations

import sys

import click

from gpuzombie.cli.common import echo_json, json_option, procfs_option, to_jsonable
from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.nvml import default_backend
from gpuzombie.prestop import DEFAULT_KILL_WAIT, DEFAULT_TIMEOUT, PrestopEvent, render_text, run_prestop
from gpuzombie.prestop.pid1log import Pid1Log
from gpuzombie.prestop.targets import in_host_pid_namespace
from gpuzombie.proc.procfs import Procfs


@click.command()
@click.option("--timeout", type=float, default=DEFAULT_TIMEOUT, show_default=True,
              envvar="GPUZOMBIE_PRESTOP_TIMEOUT",
              help="Seconds between SIGTERM and SIGKILL. With --kill-wait it must fit the pod's "
                   "terminationGracePeriodSeconds (the hook's time counts against it).")
@click.option("--kill-wait", type=float, default=DEFAULT_KILL_WAIT, show_default=True,
              help="Seconds to wait for processes to vanish after SIGKILL before calling them survivors.")
@click.option("--dry-run", is_flag=True, help="List the targets and signal nothing.")
@click.option("--no-orphans", is_flag=True, help="Stop only GPU holders, not other orphans.")
@click.option("--no-nvml", is_flag=True, help="Do not ask NVML (the /dev/nvidia* fd scan still runs).")
@click.option("--pid1-log/--no-pid1-log", default=True, show_default=True,
              envvar="GPUZOMBIE_PRESTOP_PID1_LOG",
              help="Also write the log lines to /proc/1/fd/1, so they reach `kubectl logs`.")
@json_option
@procfs_option
def command(timeout: float, kill_wait: float, dry_run: bool, no_orphans: bool, no_nvml: bool,
            pid1_log: bool, as_json: bool, procfs: str) -> int:
    """Stop every GPU-holding process and orphan of this container, before the kubelet's SIGKILL.

    Run it inside the pod's PID namespace (as a preStop exec hook). Exit 0: every target is gone
    (or there was none); 1: something survived SIGKILL; 2: usage or environment error.
    """
    if timeout < 0 or kill_wait < 0:
        raise GpuzombieError("--timeout and --kill-wait must be >= 0", ExitStatus.ERROR)
    # In the host's PID namespace PID 1 is the node's init: its stdout is no container log.
    sink = Pid1Log() if pid1_log and not in_host_pid_namespace(procfs) else None
    live_out = sys.stderr if as_json else sys.stdout

    def on_event(event: PrestopEvent) -> None:
        line = f"gpuzombie prestop: [{event.at_s:7.3f}s] {event.message}"
        click.echo(line, file=live_out)
        if sink is not None:
            sink.write_line(line)

    try:
        report = run_prestop(procfs=Procfs(procfs), nvml=None if no_nvml else default_backend(),
                             timeout=timeout, kill_wait=kill_wait, dry_run=dry_run,
                             include_orphans=not no_orphans, on_event=on_event)
    finally:
        if sink is not None:
            sink.close()
    if as_json:
        data = to_jsonable(report)
        data["pid1_log"] = ("written to /proc/1/fd/1" if sink is not None and sink.why_not is None
                            else (sink.why_not if sink is not None else "off"))
        echo_json(data)
    else:
        click.echo(render_text(report))
    return report.exit_status
