"""`gpuzombie trace`: the original experiment's gpu-pod-trace.sh + node-observe.sh (table, or --json)."""

from __future__ import annotations

import time

import click

from gpuzombie.cli.common import (
    check_node_inputs,
    echo_json,
    echo_warnings,
    ghost_options,
    json_option,
    node_source_options,
    nvml_backend,
    procfs_option,
)
from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.attribution import current_view
from gpuzombie.k8s import names as cri_names
from gpuzombie.k8s.liveness import PodLister
from gpuzombie.k8s.podresources import list_pod_resources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.trace.model import trace_node
from gpuzombie.trace.render import render_text
from gpuzombie.units import MIB


@click.command()
@procfs_option
@json_option("gpuzombie.trace/1", "docs/trace.md")
@node_source_options
@ghost_options
def command(
    procfs: str,
    as_json: bool,
    cri_socket: str | None,
    cri_timeout: float,
    pod_resources_socket: str,
    cdi_dirs: tuple[str, ...],
    trust_runtime: bool,
    ghost_threshold_mib: int,
    baseline_mib: int | None,
    nvml_replay: str | None,
) -> int:
    """On a node (root): every GPU process, /dev/nvidia* holder and zombie mapped to its container
    and pod, and each GPU's memory split into driver baseline, processes and ghost.

    A GPU holder in the cgroup of a pod the runtime no longer runs is marked STALE; one in a pod the
    kubelet's PodResources did not give that GPU to, FOREIGN (a HOLDER column and a line each).

    Exit 0 healthy, 1 findings (zombies, pids gone from /proc but listed by NVML, ghost memory,
    stale or foreign holders) or incomplete (a process that could hide one could not be read, or
    the runtime could not say whether a pod still runs: the summary says so), 2 error.
    """
    check_node_inputs(procfs, who="trace")
    try:
        with PodLister(
            cri_socket, timeout=cri_timeout, kubelet_socket=pod_resources_socket, trust_runtime=trust_runtime
        ) as pods:
            report = trace_node(
                procfs=Procfs(procfs),
                nvml=nvml_backend(nvml_replay),
                view=current_view(),
                names=cri_names.RuntimeNames(cri_socket, timeout=cri_timeout),
                resources=list_pod_resources(pod_resources_socket, cdi_dirs=cdi_dirs),
                now=time.time(),
                baseline=None if baseline_mib is None else baseline_mib * MIB,
                threshold=ghost_threshold_mib * MIB,
                pods=pods,
            )
    except (OSError, ValueError) as exc:  # ValueError: a tree whose stat has no btime line
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise GpuzombieError(f"cannot read {procfs}: {reason}") from exc
    if as_json:
        echo_json(report)
    else:
        echo_warnings("trace", report.warnings)
        click.echo(render_text(report))
    return int(ExitStatus.OK if report.summary.healthy else ExitStatus.FINDINGS)
