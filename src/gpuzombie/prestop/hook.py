"""The preStop hook's front end without click or rich: ``python3 -m gpuzombie.prestop``.

A hook runs in the user's training image on every pod deletion, so it starts fast (standard
library only: ~0.1 s instead of the full CLI's ~0.6 s of imports) and needs nothing else installed.
``gpuzombie prestop`` (the click command) calls the same ``run_hook``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import traceback
from typing import TYPE_CHECKING, Any, TextIO

from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.jsonout import dumps, to_jsonable
from gpuzombie.prestop.options import OPTIONS, HookOption, HookOptions, Kind
from gpuzombie.prestop.pid1log import Pid1Log
from gpuzombie.prestop.run import PrestopReport, render_text, run_prestop, scope_missed
from gpuzombie.prestop.scope import Scope
from gpuzombie.prestop.terminate import PrestopEvent
from gpuzombie.proc.pidns import is_root_pidns, reader_pidns
from gpuzombie.proc.procfs import Procfs
from gpuzombie.usage import OneLineParser, UsageError

if TYPE_CHECKING:
    from gpuzombie.gpu.nvml import NvmlBackend

LOG_LINE_LIMIT = 1000
"""A log line names a process, its reasons and (the plan line) PID 1's command line: bounded, escaped."""
MAX_OPEN_FILES = 1 << 20
"""The kernel's default fs.nr_open: a scan holds one pidfd per process that may be a target (in a
pod, every process of its namespace; with a scope, those the scope holds)."""


def report_json(report: PrestopReport, pid1_log: str) -> str:
    """The report as JSON, through the library's one serializer, with where the live log's copy went."""
    return dumps({**to_jsonable(report), "pid1_log": pid1_log})


def open_pid1_log(procfs: str, wanted: bool, dry_run: bool) -> tuple[Pid1Log | None, str]:
    """The copy of the live log for ``kubectl logs``, or None and why there is none."""
    if not wanted:
        return None, "off"
    if dry_run:
        return None, "off (dry run: nothing is written to PID 1)"
    pidns = reader_pidns(procfs)
    if pidns is None or is_root_pidns(pidns):
        return None, "off (not inside a pod: PID 1's stdout is no container log)"
    return Pid1Log(), ""


def pid1_log_status(sink: Pid1Log | None, off: str) -> str:
    """Where the live log's copy went, for the JSON report's ``pid1_log``."""
    if sink is None:
        return off
    return sink.why_not or f"written to {sink.path}"


def raise_open_file_limit() -> None:
    """Raise the soft limit to the hard one (the soft limit is often 1024); past the hard limit, targets
    left without a pidfd stop the run before any signal, with exit 2 naming the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass  # the pins that fail are reported (not signalled), never a crash


def run_hook(options: HookOptions, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run prestop, writing the live log (and the copy for ``kubectl logs``) and the result.

    The summary is printed once: in text mode it ends the table, so the live log leaves it out."""
    out = out or sys.stdout
    err = err or sys.stderr
    scope = Scope.from_options(options.cgroup, options.container)
    raise_open_file_limit()
    sink, sink_off = open_pid1_log(options.procfs, options.pid1_log, options.dry_run)
    live = err if options.as_json else out

    def on_event(event: PrestopEvent) -> None:
        line = f"gpuzombie prestop: [{event.at_s:7.3f}s] {escape(event.message, LOG_LINE_LIMIT)}"
        if options.as_json or event.kind != "done":
            print(line, file=live, flush=True)
        if sink is not None:
            sink.write_line(line)

    try:
        report = run_prestop(
            procfs=Procfs(options.procfs),
            nvml=nvml_backend() if options.nvml_when == "always" else None,
            nvml_if_undecided=nvml_backend if options.nvml_when == "undecided" else None,
            timeout=options.timeout,
            kill_wait=options.kill_wait,
            dry_run=options.dry_run,
            include_orphans=not options.no_orphans,
            same_cgroup=options.same_cgroup,
            scope=scope,
            on_event=on_event,
        )
    finally:
        if sink is not None:
            sink.close()
    if options.as_json:
        print(report_json(report, pid1_log_status(sink, sink_off)), file=out, flush=True)
    else:
        print(render_text(report), file=out, flush=True)
    if scope_missed(report.plan):
        print(f"gpuzombie: error: scope matched no process ({report.plan.scope}): is the path mistyped?", file=err)
    return report.exit_status


def nvml_backend() -> NvmlBackend:
    """NVML through nvidia-ml-py; under ``python3 -S`` (the zipapp) the image's own site-packages
    are added first, as the one place outside the standard library the hook looks for it."""
    if sys.flags.no_site and "pynvml" not in sys.modules:
        import site

        site.main()
    from gpuzombie.gpu.nvml import default_backend

    return default_backend()


def _argparse_default(option: HookOption, default: object) -> object:
    """The environment's value when it is set and not empty (as click reads it), else ``default``:
    a string, converted only when the option is not on the command line (``parse_hook_args``)."""
    text = os.environ.get(option.envvar) if option.envvar else None
    return text or default


def build_parser(prog: str, defaults: dict[str, object] | None = None) -> argparse.ArgumentParser:
    """The hook's parser, from ``OPTIONS`` (``defaults`` overrides an option's default by name)."""
    ap = OneLineParser(
        prog=prog,
        description="SIGTERM this container's GPU holders and orphans, wait, SIGKILL the rest. Exit 0 all "
        "gone, 1 survivors or unreadable processes, 2 error (or host PID namespace without a scope), 130 interrupted.",
    )
    for option in OPTIONS:
        default = (defaults or {}).get(option.name, option.default)
        if option.kind is Kind.FLAG:
            ap.add_argument(option.flag, dest=option.name, action="store_true", help=option.help_text())
        elif option.kind is Kind.SWITCH:
            ap.add_argument(
                option.flag,
                dest=option.name,
                action=argparse.BooleanOptionalAction,
                default=_argparse_default(option, default),
                help=option.help_text(),
            )
        else:
            ap.add_argument(
                option.flag,
                dest=option.name,
                type=option.convert or str,
                default=_argparse_default(option, default),
                choices=option.choices or None,
                metavar=option.metavar,
                help=option.help_text() + ("" if default is None else f" (default {default})"),
            )
    return ap


def parse_hook_args(argv: list[str] | None, prog: str, defaults: dict[str, object] | None = None) -> dict[str, Any]:
    """The values of ``HookOptions`` from the command line and the environment; raises UsageError.
    argparse converts a string default of a value with its ``type``; a switch's is converted here."""
    values = vars(build_parser(prog, defaults).parse_args(argv))
    for option in OPTIONS:
        text = values[option.name]
        if option.kind is Kind.SWITCH and isinstance(text, str):
            assert option.convert is not None
            try:
                values[option.name] = option.convert(text)
            except ValueError as exc:
                raise UsageError(f"{option.envvar}: {exc}") from exc
    return values


def main(
    argv: list[str] | None = None, *, prog: str = "python3 -m gpuzombie.prestop", nvml_default: str = "always"
) -> int:
    """The hook's entry point: an exit code, and never a traceback (the CLI's rules, without click).
    The zipapp's ``__main__`` passes ``nvml_default="undecided"``."""
    try:
        values = parse_hook_args(argv, prog, {"nvml": nvml_default})
    except UsageError as exc:
        print(f"gpuzombie: usage error: {exc} (see '{prog} --help')", file=sys.stderr)
        return ExitStatus.ERROR
    except SystemExit as exc:  # --help
        return ExitStatus.ERROR if exc.code else ExitStatus.OK
    try:
        return run_hook(HookOptions(**values))
    except GpuzombieError as exc:
        print(f"gpuzombie: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("gpuzombie: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except Exception as exc:  # the last line of defence, as gpuzombie.cli.main has it
        if os.environ.get("GPUZOMBIE_DEBUG"):
            traceback.print_exc()
        print(
            f"gpuzombie: internal error: {type(exc).__name__}: {exc} (set GPUZOMBIE_DEBUG=1 for details)",
            file=sys.stderr,
        )
        return ExitStatus.ERROR
