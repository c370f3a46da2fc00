"""`gpuzombie observe`: the original experiment's observe.sh as one report (table, or --json)."""

from __future__ import annotations

import click

from gpuzombie.cli.common import echo_json, echo_warnings, ghost_options, json_option, nvml_backend, procfs_option
from gpuzombie.observe import observe, render_text
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB


@click.command()
@procfs_option
@json_option
@ghost_options
def command(
    procfs: str, as_json: bool, ghost_threshold_mib: int, baseline_mib: int | None, nvml_replay: str | None
) -> int:
    """Inside a container (or on a node): PID 1, process tree, zombies, orphans, GPU memory, GPU
    processes, /dev/nvidia* holders, orphaned contexts and ghost memory.

    Exit 0 healthy, 1 findings (zombies, orphans, orphaned contexts, ghost memory) or incomplete
    (a process that could hide one could not be read: the summary says INCOMPLETE), 2 error
    (also when /proc is not this PID namespace's own).
    """
    report = observe(
        Procfs(procfs),
        nvml_backend(nvml_replay),
        baseline=None if baseline_mib is None else baseline_mib * MIB,
        ghost_threshold=ghost_threshold_mib * MIB,
    )
    if as_json:
        echo_json(report)
    else:
        echo_warnings("observe", report.view.warnings)
        click.echo(render_text(report), nl=False)
    return int(report.exit_status)
