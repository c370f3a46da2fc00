"""`gpuzombie observe`: the seed's observe.sh as one report (table, or --json)."""

from __future__ import annotations

import json

import click

from gpuzombie.cli.common import echo_json, json_option, procfs_option
from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.attribution import DEFAULT_GHOST_THRESHOLD
from gpuzombie.gpu.nvml import MIB, FakeNvml, NvmlBackend, default_backend
from gpuzombie.observe import observe, render_text
from gpuzombie.proc.procfs import Procfs


def _replayed(path: str) -> NvmlBackend:
    try:
        with open(path) as f:
            return FakeNvml.from_dict(json.load(f))
    except (OSError, ValueError, TypeError) as exc:
        raise GpuzombieError(f"cannot replay NVML snapshot {path}: {exc}") from exc


@click.command()
@procfs_option
@json_option
@click.option("--ghost-threshold-mib", type=click.IntRange(min=0), default=DEFAULT_GHOST_THRESHOLD // MIB,
              show_default=True, help="Flag a GPU when unexplained memory exceeds this.")
@click.option("--baseline-mib", type=click.IntRange(min=0), default=None,
              help="Memory used with no process at all. Default: the driver's reservation from NVML.")
@click.option("--nvml-replay", type=click.Path(dir_okay=False), default=None, hidden=True,
              help="Read NVML state from a JSON snapshot instead of the driver (tests, replays).")
def command(procfs: str, as_json: bool, ghost_threshold_mib: int, baseline_mib: int | None,
            nvml_replay: str | None) -> int:
    """Inside a container (or on a node): PID 1, process tree, zombies, orphans, GPU memory, GPU
    processes, /dev/nvidia* holders, orphaned contexts and ghost memory.

    Exit 0 healthy, 1 findings (zombies, orphans, orphaned contexts, ghost memory), 2 error.
    """
    report = observe(
        Procfs(procfs),
        _replayed(nvml_replay) if nvml_replay else default_backend(),
        baseline=None if baseline_mib is None else baseline_mib * MIB,
        ghost_threshold=ghost_threshold_mib * MIB,
    )
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(render_text(report), nl=False)
    return int(report.exit_status if report.exit_status else ExitStatus.OK)
