"""`gpuzombie top`: a live, pod-aware view of a GPU node (full screen with the `top` extra; --once
prints one frame without it)."""

from __future__ import annotations

import shutil
import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuzombie.cli.common import (
    NodeOptions,
    NodeParts,
    choice_option,
    echo_json,
    node_options,
    node_scan_options,
    procfs_option,
    seconds_option,
    unreadable_procfs,
)
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.exitcodes import ExitStatus

if TYPE_CHECKING:
    from gpuzombie.top.model import NodeView


def _app_module() -> Any:
    try:
        from gpuzombie.top import app
    except ImportError as exc:
        raise GpuzombieError(
            needs_extra("the full-screen view (--once prints one frame without it)", "top", exc)
        ) from exc
    return app


def _print_frame(view: NodeView, *, width: int | None, tree: bool, sort: str, namespace: str, text: str) -> None:
    from gpuzombie.top.render import render_text

    columns = width or (shutil.get_terminal_size((160, 24)).columns if sys.stdout.isatty() else 160)
    expanded: frozenset[str] | None = None if tree else frozenset()
    click.echo(render_text(view, width=columns, sort=sort, namespace=namespace, text=text, expanded=expanded), nl=False)


@click.command()
@node_options
@procfs_option
@seconds_option("--interval", 2.0, least=0.2, help="Refresh every S seconds (one node scan each).")
@click.option("--once", is_flag=True, help="Print one frame as text and exit (scripts; needs no Textual).")
@click.option(
    "--json", "as_json", is_flag=True, help="With --once: the frame as JSON (schema gpuzombie.top/1, docs/top.md)."
)
@click.option("--tree", is_flag=True, help="With --once: every pod's processes under it.")
@choice_option(
    "--sort",
    ("memory", "zombies", "age", "name"),
    "memory",
    help="Sort pods by GPU memory, zombies + orphans, age or name (keys m, z, a, n).",
)
@click.option("--namespace", default="", metavar="NS", help="Only pods of this namespace (key N cycles).")
@click.option(
    "--filter",
    "text",
    default="",
    metavar="TEXT",
    help="Only pods whose names, PID 1, a command line or a pid match (key /).",
)
@click.option(
    "--width",
    type=click.IntRange(min=40, max=1000),
    default=None,
    metavar="COLUMNS",
    help="With --once: the frame's width. Default: the terminal's, 160 when not a terminal.",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let keys k / K signal the selected process and r reap the selected stale pod, each after a "
    "confirmation, through pidfds (as prestop and reap). Off: top is read-only.",
)
@node_scan_options("The node's name in the header.")
def command(
    node: NodeOptions,
    interval: float,
    once: bool,
    as_json: bool,
    tree: bool,
    sort: str,
    namespace: str,
    text: str,
    width: int | None,
    allow_actions: bool,
    node_name: str,
) -> int:
    """On a node (root): every GPU and MIG instance, the pods holding each with their GPU memory,
    PID 1, zombies, orphans, D-state holders, stale or foreign marks and grace-period risk, and
    each pod's processes; host processes holding GPUs in their own group. Refreshes every
    --interval seconds; read-only unless --allow-actions.

    In a debug pod: kubectl debug node/NAME -it --profile=sysadmin --image=IMAGE -- gpuzombie top --procfs /host/proc

    Exit 0 (quit, or --once printed a frame), 2 on an unreadable procfs or a bad option.
    """
    if (as_json or tree or width) and not once:
        raise click.UsageError("--json, --tree and --width go with --once")
    if allow_actions and once:
        raise click.UsageError("--allow-actions needs the full-screen view, not --once")
    app = _app_module() if not once else None  # before any scan: a missing Textual is said at once
    from gpuzombie.top.model import arrange
    from gpuzombie.top.source import NodeSource

    with NodeParts(node, who="top") as parts:
        source = NodeSource(**parts.scan_inputs(), resources=parts.resources, node_name=node_name)
        if once:
            try:
                view = source()
            except (OSError, ValueError) as exc:
                raise unreadable_procfs(node.procfs, exc) from exc
            view = arrange(view, sort=sort, namespace=namespace, text=text)
            if as_json:
                echo_json(view)
            else:
                _print_frame(view, width=width, tree=tree, sort=sort, namespace=namespace, text=text)
            return int(ExitStatus.OK)
        actions = None
        if allow_actions:
            from gpuzombie.top import actions as top_actions

            def send(proc: Any, sig: signal.Signals) -> str:
                return top_actions.signal_process(node.procfs, proc, sig)

            def reap(pod: Any) -> str:
                return top_actions.reap_pod(
                    pod, procfs=parts.procfs(), pods=parts.pods, names=parts.names, nvml=parts.nvml
                )

            assert app is not None
            actions = app.Actions(signal=send, reap=reap)
        assert app is not None
        top = app.TopApp(source, interval=interval, actions=actions)
        top.sort, top.namespace, top.text = sort, namespace, text
        top.run()
    return int(ExitStatus.OK)
