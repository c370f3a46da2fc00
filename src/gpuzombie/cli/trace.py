"""`gpuzombie trace`: the original experiment's gpu-pod-trace.sh + node-observe.sh (table, or --json)."""

from __future__ import annotations

import time

import click

from gpuzombie.cli.common import (
    NodeOptions,
    NodeParts,
    echo_json,
    echo_warnings,
    json_option,
    node_options,
    node_scan_options,
    procfs_option,
    unreadable_procfs,
)
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.trace.model import trace_node
from gpuzombie.trace.render import render_text


@click.command()
@node_options
@procfs_option
@json_option("gpuzombie.trace/1", "docs/trace.md")
@node_scan_options()
def command(node: NodeOptions, as_json: bool) -> int:
    """On a node (root): every GPU process, /dev/nvidia* holder and zombie mapped to its container
    and pod, and each GPU's memory split into driver baseline, processes and ghost.

    A GPU holder in the cgroup of a pod the runtime no longer runs is marked STALE; one in a pod the
    kubelet's PodResources did not give that GPU to, FOREIGN (a HOLDER column and a line each).

    Exit 0 healthy, 1 findings (zombies, pids gone from /proc but listed by NVML, ghost memory,
    stale or foreign holders) or incomplete (a process that could hide one could not be read, or
    the runtime could not say whether a pod still runs: the summary says so), 2 error.
    """
    try:
        with NodeParts(node, who="trace") as parts:
            report = trace_node(**parts.scan_inputs(), resources=parts.resources(), now=time.time())
    except (OSError, ValueError) as exc:
        raise unreadable_procfs(node.procfs, exc) from exc
    if as_json:
        echo_json(report)
    else:
        echo_warnings("trace", report.warnings)
        click.echo(render_text(report))
    return int(ExitStatus.OK if report.summary.healthy else ExitStatus.FINDINGS)
