"""Entry point: one group, one place that maps exceptions to exit codes and one-line messages."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback

import click

from gpuzombie import __version__
from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus

# click >= 8.2 raises this for a bare `gpuzombie` (or group); 8.1 printed the help and exited 0 itself
# (the GPU device's python has whichever click it has).
NO_ARGS_IS_HELP: tuple[type[click.UsageError], ...] = tuple(
    error for error in [getattr(click.exceptions, "NoArgsIsHelpError", None)] if error is not None
)

MESSAGE_LIMIT = 4096
"""The characters of one error line: long enough for a path and a manifest's names, bounded."""

# Each module gpuzombie.cli.<name> defines ``command``, a click command registered under <name>.
COMMAND_MODULES = (
    "observe",
    "trace",
    "top",
    "lab",
    "prestop",
    "exporter",
    "reap",
    "fence",
    "check",
    "webhook",
    "preflight",
    "cluster",
)


def _installed(name: str) -> bool:
    """Whether ``gpuzombie.cli.<name>`` is in this installation: the node image leaves the lab out
    (docker/node-excludes.txt), and there ``lab`` is no command rather than an import error."""
    return importlib.util.find_spec(f"gpuzombie.cli.{name}") is not None


class LazyCommands(click.Group):
    """Imports ``gpuzombie.cli.<name>`` only when that command runs (or help lists it).

    ``observe`` in a container and ``prestop`` in a preStop hook then start without the imports of
    the lab, the plots or the k8s clients (measured: 0.24 s of imports for every command before).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMAND_MODULES if _installed(name)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMAND_MODULES or not _installed(cmd_name):
            return None
        command: click.Command = importlib.import_module(f"gpuzombie.cli.{cmd_name}").command
        return command


@click.group(cls=LazyCommands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpuzombie")
def cli() -> None:
    """Reproduce, detect, measure and fix zombie processes, orphans, ghost GPU memory and
    grace-period waste of GPU workloads on Kubernetes.

    Exit codes: 0 healthy / done, 1 findings, 2 usage or environment error, 130 interrupted.
    """


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status; never lets a traceback reach the user."""
    try:
        result = cli.main(args=argv, prog_name="gpuzombie", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:  # one line, with where to look, instead of click's three
        if exc.ctx is not None and isinstance(exc, NO_ARGS_IS_HELP):  # a bare command asks for its help
            click.echo(exc.ctx.get_help())
            return ExitStatus.OK
        command = exc.ctx.command_path if exc.ctx else "gpuzombie"
        message = escape(exc.format_message(), MESSAGE_LIMIT)
        click.echo(f"gpuzombie: usage error: {message} (see '{command} --help')", err=True)
        return ExitStatus.ERROR
    except click.ClickException as exc:
        exc.show()
        return ExitStatus.ERROR
    except click.exceptions.Abort:
        click.echo("gpuzombie: interrupted", err=True)
        return ExitStatus.INTERRUPTED
    except GpuzombieError as exc:  # a message may quote a manifest's names or a file's: escaped here, once
        click.echo(f"gpuzombie: error: {escape(str(exc), MESSAGE_LIMIT)}", err=True)
        return exc.status
    except KeyboardInterrupt:
        click.echo("gpuzombie: interrupted", err=True)
        return ExitStatus.INTERRUPTED
    except Exception as exc:  # the last line of defence: one line, the traceback only on request
        if os.environ.get("GPUZOMBIE_DEBUG"):
            traceback.print_exc()
        click.echo(
            f"gpuzombie: internal error: {type(exc).__name__}: {escape(str(exc), MESSAGE_LIMIT)} "
            "(set GPUZOMBIE_DEBUG=1 for details)",
            err=True,
        )
        return ExitStatus.ERROR
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
