"""`gpuzombie observe`: the original experiment's observe.sh as one report (table, or --json)."""

from __future__ import annotations

import click

from gpuzombie.cli.common import echo_json, echo_warnings, ghost_options, json_option, nvml_backend, procfs_option
from gpuzombie.observe import observe, render_text
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB


@click.command()
@procfs_option
@json_option("gpuzombie.observe/1", "docs/observe.md")
@ghost_options
@click.option(
    "--text-to-stderr",
    is_flag=True,
    help="With --json: also write the readable report to stderr, from the same snapshot "
    "(the lab's observe logs; stdout stays the JSON alone).",
)
def command(
    procfs: str,
    as_json: bool,
    ghost_threshold_mib: int,
    baseline_mib: int | None,
    nvml_replay: str | None,
    text_to_stderr: bool,
) -> int:
    """Inside a container (or on a node): PID 1, process tree, zombies, orphans, GPU memory, GPU
    processes, /dev/nvidia* holders, orphaned contexts and ghost memory.

    Exit 0 healthy, 1 findings (zombies, orphans, orphaned contexts, ghost memory) or incomplete
    (a process that could hide one could not be read: the summary says INCOMPLETE), 2 error
    (also when /proc is not this PID namespace's own).
    """
    if text_to_stderr and not as_json:
        raise click.UsageError("--text-to-stderr goes with --json (without it the text is on stdout)")
    report = observe(
        Procfs(procfs),
        nvml_backend(nvml_replay),
        baseline=None if baseline_mib is None else baseline_mib * MIB,
        ghost_threshold=ghost_threshold_mib * MIB,
    )
    if as_json:
        echo_json(report)
        if text_to_stderr:
            click.echo(render_text(report), nl=False, err=True)
    else:
        echo_warnings("observe", report.view.warnings)
        click.echo(render_text(report), nl=False)
    return int(report.exit_status)
