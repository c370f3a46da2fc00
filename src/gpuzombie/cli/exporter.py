"""`gpuzombie exporter`: the node's zombies, orphans, GPU memory by pod, ghost memory and grace
risk as Prometheus metrics (or, with --once, one exposition on stdout)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from gpuzombie.cli.common import (
    CommandFn,
    NodeOptions,
    NodeParts,
    count_option,
    node_options,
    node_scan_options,
    procfs_option,
    seconds_option,
    server_options,
    stopped,
    tls_pair,
)
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.serving import ListenAddress, parse_listen

if TYPE_CHECKING:  # the exporter extra (prometheus-client) is imported when the command runs
    from prometheus_client import CollectorRegistry

    from gpuzombie.exporter import NodeCollector, ScanResult, StaleReaper
    from gpuzombie.prestop.terminate import PrestopEvent
    from gpuzombie.reap import ReapReport


def _listen(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[ListenAddress, ...]:
    try:
        return tuple(dict.fromkeys(parse_listen(v) for v in value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh]?)")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``90``, ``90s``, ``10m``, ``1h`` as seconds (at least 1)."""
    if value is None:
        return None
    match = _DURATION.fullmatch(value.strip())
    seconds = float(match.group(1)) * _SECONDS[match.group(2)] if match else 0.0
    if seconds < 1:
        raise click.BadParameter(f"{value!r} is no duration of 1 s or more (e.g. 90s, 10m, 1h)")
    return seconds


def _require_exporter() -> None:
    try:
        import gpuzombie.exporter  # noqa: F401
    except ImportError as exc:
        raise GpuzombieError(needs_extra("the exporter", "exporter", exc)) from exc


def _default_listen() -> tuple[str, ...]:
    _require_exporter()
    from gpuzombie.exporter import DEFAULT_LISTEN

    return (DEFAULT_LISTEN,)


@dataclass(frozen=True)
class Serving:
    """Where and how /metrics, /healthz and /readyz are served (``serving_options``)."""

    listen: tuple[ListenAddress, ...]
    tls_cert: str | None
    tls_key: str | None
    tls_client_ca: str | None
    tls_reload_seconds: float
    read_timeout: float
    max_connections: int
    unhealthy_after: int


def _echo(line: str) -> None:
    click.echo(f"gpuzombie exporter: {line}", err=True)


def _warn_on_change(*, errors: bool) -> Callable[[ScanResult], None]:
    """Log a scan's warnings (and, while serving, its errors) when their kind appears or clears,
    escaped, not on every scrape (exporter.warnlog)."""
    from gpuzombie.exporter import WarningLog

    log = WarningLog()

    def on_result(result: ScanResult) -> None:
        lines: tuple[str, ...]
        if result.scan is None:
            lines = (f"scan failed: {result.error}",) if errors else ()
        else:
            lines = tuple(result.scan.trace.warnings) + tuple(result.scan.namespaces.warnings)
        for line in log.lines(lines):
            _echo(line)

    return on_result


def _reaper(after: float, parts: NodeParts) -> StaleReaper:
    """The StaleReaper, reaping as ``gpuzombie reap --yes --pod-uid`` does (``run_reap``: the host PID
    namespace's mounted procfs, checked each time, and the runtime and kubelet asked again), with its
    own runtime and kubelet channels (the scans' are used from the scrape threads)."""
    from gpuzombie.exporter import StaleReaper
    from gpuzombie.reap import reaping_pid, run_reap

    reaping_pid(parts.procfs())  # refused at the start (exit 2), not at the first due pod
    own = NodeParts(parts.options, who="the exporter")

    def reap(uids: frozenset[str], on_event: Callable[[PrestopEvent], None]) -> ReapReport:
        return run_reap(
            procfs=own.procfs(),
            pods=own.pods,
            names=own.names,
            nvml=parts.nvml,
            only=uids,
            dry_run=False,
            on_event=on_event,
        )

    _echo(f"reaping pods stale for {after:g} s or more (--reap-stale-after)")
    return StaleReaper(after, reap, log=_echo)


def _serve(registry: CollectorRegistry, collector: NodeCollector, serving: Serving, min_interval: float) -> int:
    from gpuzombie.exporter import ListenError, PrometheusExporter, TlsFiles
    from gpuzombie.serving import Server, serve_until_stopped

    tls = None
    if serving.tls_cert is not None and serving.tls_key is not None:
        tls = TlsFiles(serving.tls_cert, serving.tls_key, serving.tls_client_ca)
    server = PrometheusExporter(
        registry,
        listen=serving.listen,
        probes={"/healthz": collector.liveness, "/readyz": collector.readiness},
        read_timeout=serving.read_timeout,
        max_connections=serving.max_connections,
        tls=tls,
    )

    def announce(server: Server) -> None:
        scheme = "http" if tls is None else "https"
        urls = " and ".join(f"{scheme}://{bound}/metrics" for bound in server.bound)
        _echo(f"serving {urls}, /healthz and /readyz (one node scan at most every {min_interval:g} s)")

    try:
        received = serve_until_stopped(
            server, announce=announce, log=_echo, tls_check_seconds=serving.tls_reload_seconds
        )
    except ListenError as exc:
        raise GpuzombieError(str(exc)) from exc
    except OSError as exc:  # a TLS file: TlsFileError names it
        raise GpuzombieError(f"cannot serve TLS on {', '.join(map(str, serving.listen))}: {exc}") from exc
    return stopped("exporter", received)


def serving_options(fn: CommandFn) -> CommandFn:
    """Where and how /metrics, /healthz and /readyz are served."""
    listen = click.option(
        "--listen",
        multiple=True,
        default=_default_listen,
        show_default="127.0.0.1:9844",  # the exporter's DEFAULT_LISTEN; --help must work without the extra
        callback=_listen,
        metavar="HOST:PORT",
        envvar="GPUZOMBIE_EXPORTER_LISTEN",
        help="Address to serve on, repeatable (loopback unless asked; a pod: its pod IP and "
        "127.0.0.1, for kubectl port-forward). Env: GPUZOMBIE_EXPORTER_LISTEN, space-separated.",
    )
    server = server_options(
        cert_help="Serve HTTPS with this certificate.",
        read_timeout=10.0,
        max_connections=32,
    )
    client_ca = click.option(
        "--tls-client-ca",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="PEM",
        callback=tls_pair,
        help="Require client certificates signed by this CA (mutual TLS).",
    )
    unhealthy_after = count_option(
        "--unhealthy-after",
        5,
        least=1,
        help="/healthz answers 503 after N failed scans in a row (/readyz: 503 while the last failed).",
    )
    return listen(server(client_ca(unhealthy_after(fn))))


@click.command()
@node_options
@serving_options
@procfs_option
@seconds_option("--min-interval", 10.0, least=0, help="Reuse the last node scan for scrapes within S seconds of it.")
@click.option("--once", is_flag=True, help="Print one exposition to stdout and exit (tests, cron).")
@node_scan_options("The Hostname label of the GPU series (dcgm-exporter's label for the node).")
@click.option(
    "--reap-stale-after",
    "reap_after",
    default=None,
    callback=_duration,
    metavar="D",
    help="Off unless given. Reap a pod's processes once its GPU holders have been stale for D "
    "(90s, 10m, 1h) in every scan: as `gpuzombie reap --yes --pod-uid`, through pidfds only, refused "
    "while the runtime and the kubelet cannot tell stale from unknown; each action logged, each "
    "process counted in gpuzombie_reaped_processes_total. Needs the KILL capability.",
)
def command(
    node: NodeOptions,
    min_interval: float,
    once: bool,
    node_name: str,
    reap_after: float | None,
    listen: tuple[ListenAddress, ...],
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    tls_reload_seconds: float,
    read_timeout: float,
    max_connections: int,
    unhealthy_after: int,
) -> int:
    """On a node (root): serve Prometheus metrics of zombies, orphans, GPU memory by pod, fd-only
    holders, ghost memory per GPU, GPU memory at grace-period risk and stale or foreign GPU holders.

    /metrics is the exposition, /healthz the liveness probe, /readyz the readiness probe.
    Exit 0 when stopped by SIGTERM (or --once read the node), 2 on a bad address, a port in use,
    an unreadable TLS file or /proc, a bad --reap-stale-after or one where reap could not act (not the
    host PID namespace's mounted procfs), 130 on Ctrl-C.
    """
    _require_exporter()
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuzombie.exporter import NodeCollector, scan_node
    from gpuzombie.gpu.dstate import DStateTracker
    from gpuzombie.trace.scan import NodeScan

    parts = NodeParts(node, who="the exporter")
    if reap_after is not None and once:
        raise GpuzombieError("--reap-stale-after times stale pods across scans: not with --once")
    dstate = DStateTracker()  # one for the process: how long each D-state GPU holder has been in D

    def scan() -> NodeScan:
        return scan_node(**parts.scan_inputs(), resources=parts.resources, node_name=node_name, dstate=dstate)

    on_result = _warn_on_change(errors=not once)
    reaper = _reaper(reap_after, parts) if reap_after is not None else None
    collector = NodeCollector(
        scan,
        min_interval=float("inf") if once else min_interval,
        on_result=on_result if reaper is None else _both(on_result, reaper.observe),
        unhealthy_after=unhealthy_after,
    )
    registry = CollectorRegistry()
    registry.register(collector)
    if reaper is not None:
        registry.register(reaper)
        reaper.start(collector.latest, every=max(min_interval, 1.0))
    if once:
        result = collector.latest()
        if result.scan is None:
            raise GpuzombieError(f"cannot scan {node.procfs}: {str(result.error)[:1000]}")  # main escapes it
        click.echo(generate_latest(registry).decode(), nl=False)
        return int(ExitStatus.OK)
    serving = Serving(
        listen,
        tls_cert,
        tls_key,
        tls_client_ca,
        tls_reload_seconds,
        read_timeout,
        max_connections,
        unhealthy_after,
    )
    return _serve(registry, collector, serving, min_interval)


def _both(first: Callable[[ScanResult], None], second: Callable[[ScanResult], None]) -> Callable[[ScanResult], None]:
    def both(result: ScanResult) -> None:
        first(result)
        second(result)

    return both
