"""`gpuzombie preflight`: the handover gate (``gpuzombie.handover.preflight``); its flags are parsed
there, so the click command and the zipapp the webhook injects are one front end."""

from __future__ import annotations

import click

from gpuzombie.handover.preflight import main


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> int:
    """Wait until every GPU NVML shows this container is clean; exit 1 with a termination message if not.

    Run as the first init container of a GPU pod (the webhook injects it: docs/handover.md). Flags:
    --wait S, --interval S, --tolerance-mib MIB, --fail-open, --termination-log PATH, --json
    (`gpuzombie preflight --help`). Exit 0 clean, 1 dirty or unreadable after --wait, 2 usage or
    internal error, 130 stopped by SIGTERM or SIGINT.
    """
    return main(list(args))
