"""`gpuzombie prestop`: the preStop hook. SIGTERM the pod's GPU holders and orphans, wait, SIGKILL.

The same run as ``python3 -m gpuzombie.prestop`` (stdlib only, faster to start in a hook): both
parsers are built from one table, ``gpuzombie.prestop.options.OPTIONS``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gpuzombie.prestop.hook import run_hook
from gpuzombie.prestop.options import OPTIONS, HookOption, HookOptions, Kind


def click_option(option: HookOption) -> Callable[[Any], Any]:
    """One entry of the table as a click option (the argparse side: ``prestop.hook.build_parser``)."""
    if option.kind is Kind.FLAG:
        return click.option(option.flag, option.name, is_flag=True, help=option.help_text())
    if option.kind is Kind.SWITCH:
        return click.option(
            f"{option.flag}/{option.negative_flag}",
            option.name,
            default=option.default,
            show_default=True,
            envvar=option.envvar,
            help=option.help_text(),
        )
    return click.option(
        option.flag,
        option.name,
        type=click.Choice(option.choices) if option.choices else option.convert,
        default=option.default,
        show_default=option.default is not None,
        envvar=option.envvar,
        metavar=option.metavar,
        help=option.help_text(),
    )


def _with_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(OPTIONS):
        fn = click_option(option)(fn)
    return fn


@click.command()
@_with_options
def command(**values: Any) -> int:
    """Stop every GPU-holding process and orphan of this container, before the kubelet's SIGKILL.

    Run it inside the pod's PID namespace (as a preStop exec hook); in the host's PID namespace
    it acts only on --cgroup or --container and refuses otherwise. Signals go through pidfds only.
    Exit 0: every target is gone (or there was none); 1: something survived SIGKILL, or some
    process could not be read; 2: usage or environment error, or the host namespace without a
    scope; 130: interrupted.
    """
    return run_hook(HookOptions(**values))
