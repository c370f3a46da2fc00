"""`gpuzombie reap`: end the processes of stale pods, GPU holders that outlived their pod (dry run by default)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import click

from gpuzombie.cli.common import (
    NodeOptions,
    NodeParts,
    cri_socket_option,
    echo_json,
    json_option,
    node_options,
    pod_resources_socket_option,
    procfs_option,
    seconds_option,
    trust_runtime_option,
)
from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus

_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
"""An API pod's UID, or a static pod's (the kubelet's hash of its manifest: 32 hex digits)."""


def _refusal_as_json(fn: Callable[..., int]) -> Callable[..., int]:
    """With --json a refusal is JSON on stdout too: a script reading it learns why, not an empty document."""

    @functools.wraps(fn)
    def command(**params: Any) -> int:
        try:
            return fn(**params)
        except GpuzombieError as exc:
            if params["as_json"]:
                from gpuzombie.reap.run import SCHEMA

                echo_json(
                    {
                        "schema": SCHEMA,
                        "refused": str(exc),
                        "exit_status": int(exc.status),
                        "dry_run": not params["yes"],
                    }
                )
            raise

    return command


def _uids(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> frozenset[str] | None:
    for uid in value:
        if not _UID.fullmatch(uid):
            raise click.BadParameter(
                f"{uid!r} is no pod UID (8-4-4-4-12 hex digits as kubectl shows metadata.uid, or a static pod's 32)"
            )
    return frozenset(value) if value else None


@click.command()
@node_options
@click.option("--yes", is_flag=True, help="Act: signal the processes. Without it, a dry run lists them.")
@click.option(
    "--pod-uid",
    "pod_uids",
    multiple=True,
    callback=_uids,
    metavar="UID",
    help="Only this stale pod (repeatable). A pod the runtime runs is never touched, named or not.",
)
@seconds_option("--timeout", 10.0, least=0, help="Seconds between SIGTERM and SIGKILL.")
@seconds_option(
    "--kill-wait",
    2.0,
    least=0,
    help="Seconds to wait after SIGKILL; a process still alive then (state D: stuck in the driver) is "
    "reported as not killable, never waited for longer.",
)
@click.option("--no-nvml", is_flag=True, help="Do not ask NVML (the /dev/nvidia* fd scan still finds the holders).")
@cri_socket_option
@seconds_option(
    "--cri-timeout",
    5.0,
    least=0.1,
    help="Give up on the CRI runtime after S seconds (then reap refuses: exit 2).",
)
@pod_resources_socket_option
@trust_runtime_option
@json_option("gpuzombie.reap/1", "docs/reap.md")
@procfs_option
@_refusal_as_json
def command(
    node: NodeOptions,
    yes: bool,
    pod_uids: frozenset[str] | None,
    timeout: float,
    kill_wait: float,
    no_nvml: bool,
    as_json: bool,
) -> int:
    """On a node (root, host PID namespace): end the processes of stale pods, those whose GPU holders
    outlived the pod (the runtime no longer lists it, or lists it with stopped sandboxes and no
    running container, and the kubelet no longer runs it). SIGTERM, --timeout, SIGKILL, through
    pidfds only (a recycled pid is never signalled).

    Only stale pods' cgroups: never a running pod's process, never a host process. Dry run unless
    --yes. Refuses (exit 2) without a CRI runtime that answers, when the kubelet runs a pod that
    runtime does not list (not the kubelet's runtime), and without the kubelet's PodResources
    unless --trust-runtime-without-kubelet: it could not tell stale from unknown.

    With --json a refusal is JSON too, {"schema": "gpuzombie.reap/1", "refused": LINE, "exit_status":
    2, ...} on stdout (and the line on stderr): no stale_pods key, so it never reads as "nothing stale".

    Exit 0: nothing stale, or every target ended; 1: a dry run found targets, a process survived
    (state D: not killable), or a process could not be read; 2: usage or environment error
    (no CRI runtime, not root, not the host PID namespace).
    """
    from gpuzombie.reap import render_text, run_reap

    def log(event):
        if not as_json:
            click.echo(f"gpuzombie reap: {event.message}", err=True)

    with NodeParts(node, who="reap") as parts:
        try:
            report = run_reap(
                procfs=parts.procfs(),
                pods=parts.pods,
                names=parts.names,
                nvml=None if no_nvml else parts.nvml,
                only=pod_uids,
                timeout=timeout,
                kill_wait=kill_wait,
                dry_run=not yes,
                on_event=log,
            )
        except OSError as exc:
            raise GpuzombieError(f"cannot read {node.procfs}: {exc.strerror or exc}", ExitStatus.ERROR) from exc
    if as_json:
        echo_json(report)
    else:
        click.echo(render_text(report))
    return report.exit_status
