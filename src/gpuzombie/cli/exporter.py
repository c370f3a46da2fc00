"""`gpuzombie exporter`: the node's zombies, orphans, GPU memory by pod, ghost memory and grace
risk as Prometheus metrics (or, with --once, one exposition on stdout)."""

from __future__ import annotations

import re
from typing import Any

import click

from gpuzombie.cli.common import (
    check_node_inputs,
    ghost_options,
    node_name_option,
    node_source_options,
    nvml_backend,
    procfs_option,
    server_options,
    stopped,
    tls_pair,
)
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.k8s.liveness import PodLister
from gpuzombie.k8s.names import RuntimeNames
from gpuzombie.units import MIB


def _listen(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    try:
        return tuple(dict.fromkeys(_import_exporter().parse_listen(v) for v in value))
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


def _import_exporter() -> Any:
    try:
        from gpuzombie import exporter
    except ImportError as exc:
        raise GpuzombieError(needs_extra("the exporter", "exporter", exc)) from exc
    return exporter


def _warn_on_change(exporter: Any, echo: Any, *, errors: bool) -> Any:
    """Log a scan's warnings (and, while serving, its errors) when their kind appears or clears,
    escaped, not on every scrape (exporter.warnlog)."""
    log = exporter.WarningLog()

    def on_result(result: Any) -> None:
        lines: tuple[str, ...]
        if result.scan is None:
            lines = (f"scan failed: {result.error}",) if errors else ()
        else:
            lines = tuple(result.scan.trace.warnings) + tuple(result.scan.namespaces.warnings)
        for line in log.lines(lines):
            echo(f"gpuzombie exporter: {line}")

    return on_result


def _both(first: Any, second: Any) -> Any:
    def both(result: Any) -> None:
        first(result)
        second(result)

    return both


def _reaper(
    exporter: Any,
    after: float,
    procfs: str,
    nvml: Any,
    echo: Any,
    cri_socket: str | None,
    cri_timeout: float,
    pod_resources_socket: str,
    trust_runtime: bool,
) -> Any:
    """The StaleReaper, reaping as ``gpuzombie reap --yes --pod-uid`` does (``run_reap``: the host PID
    namespace's mounted procfs, checked each time, and the runtime and kubelet asked again), with its
    own runtime and kubelet channels (the scans' are used from the scrape threads)."""
    from gpuzombie.proc.procfs import Procfs
    from gpuzombie.reap import reaping_pid, run_reap

    reaping_pid(Procfs(procfs))  # refused at the start (exit 2), not at the first due pod
    pods = PodLister(cri_socket, timeout=cri_timeout, kubelet_socket=pod_resources_socket, trust_runtime=trust_runtime)
    names = RuntimeNames(cri_socket, timeout=cri_timeout)

    def reap(uids: frozenset[str], on_event: Any) -> Any:
        return run_reap(
            procfs=Procfs(procfs), pods=pods, names=names, nvml=nvml, only=uids, dry_run=False, on_event=on_event
        )

    echo(f"gpuzombie exporter: reaping pods stale for {after:g} s or more (--reap-stale-after)")
    return exporter.StaleReaper(after, reap, log=lambda line: echo(f"gpuzombie exporter: {line}"))


def _serve(exporter: Any, registry: Any, collector: Any, serving: dict[str, Any], min_interval: float) -> int:
    from gpuzombie.serving import serve_until_stopped

    listen = serving["listen"]
    tls = None
    if serving["tls_cert"] is not None:
        tls = exporter.TlsFiles(serving["tls_cert"], serving["tls_key"], serving["tls_client_ca"])
    server = exporter.PrometheusExporter(
        registry,
        listen=listen,
        probes={"/healthz": collector.liveness, "/readyz": collector.readiness},
        read_timeout=serving["read_timeout"],
        max_connections=serving["max_connections"],
        tls=tls,
    )

    def announce(server: Any) -> None:
        scheme = "http" if tls is None else "https"
        urls = " and ".join(f"{scheme}://{bound}/metrics" for bound in server.bound)
        click.echo(
            f"gpuzombie exporter: serving {urls}, /healthz and /readyz (one node scan at most every {min_interval:g} s)",
            err=True,
        )

    try:
        received = serve_until_stopped(
            server,
            announce=announce,
            log=lambda line: click.echo(f"gpuzombie exporter: {line}", err=True),
            tls_check_seconds=serving["tls_reload_seconds"],
        )
    except exporter.ListenError as exc:
        raise GpuzombieError(str(exc)) from exc
    except OSError as exc:  # a TLS file: TlsFileError names it
        raise GpuzombieError(f"cannot serve TLS on {', '.join(map(str, listen))}: {exc}") from exc
    return stopped("exporter", received)


def serving_options(fn: Any) -> Any:
    """Where and how /metrics, /healthz and /readyz are served."""
    listen = click.option(
        "--listen",
        multiple=True,
        default=lambda: (_import_exporter().DEFAULT_LISTEN,),
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
    unhealthy_after = click.option(
        "--unhealthy-after",
        type=click.IntRange(min=1),
        default=5,
        show_default=True,
        metavar="N",
        help="/healthz answers 503 after N failed scans in a row (/readyz: 503 while the last failed).",
    )
    return listen(server(client_ca(unhealthy_after(fn))))


@click.command()
@serving_options
@procfs_option
@click.option(
    "--min-interval",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="S",
    help="Reuse the last node scan for scrapes within S seconds of it.",
)
@click.option("--once", is_flag=True, help="Print one exposition to stdout and exit (tests, cron).")
@node_source_options
@node_name_option("The Hostname label of the GPU series (dcgm-exporter's label for the node).")
@ghost_options
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
    procfs: str,
    min_interval: float,
    once: bool,
    cri_socket: str | None,
    cri_timeout: float,
    node_name: str,
    pod_resources_socket: str,
    cdi_dirs: tuple[str, ...],
    trust_runtime: bool,
    ghost_threshold_mib: int,
    baseline_mib: int | None,
    nvml_replay: str | None,
    reap_after: float | None,
    **serving: Any,
) -> int:
    """On a node (root): serve Prometheus metrics of zombies, orphans, GPU memory by pod, fd-only
    holders, ghost memory per GPU, GPU memory at grace-period risk and stale or foreign GPU holders.

    /metrics is the exposition, /healthz the liveness probe, /readyz the readiness probe.
    Exit 0 when stopped by SIGTERM (or --once read the node), 2 on a bad address, a port in use,
    an unreadable TLS file or /proc, a bad --reap-stale-after or one where reap could not act (not the
    host PID namespace's mounted procfs), 130 on Ctrl-C.
    """
    exporter = _import_exporter()
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuzombie.gpu.attribution import current_view
    from gpuzombie.gpu.dstate import DStateTracker
    from gpuzombie.k8s.podresources import list_pod_resources
    from gpuzombie.proc.procfs import Procfs

    check_node_inputs(procfs, who="the exporter")
    if reap_after is not None and once:
        raise GpuzombieError("--reap-stale-after times stale pods across scans: not with --once")
    nvml = nvml_backend(nvml_replay)  # one backend for the process: NVML is initialised once
    names = RuntimeNames(cri_socket, timeout=cri_timeout)  # one for the process: names are kept across scans
    dstate = DStateTracker()  # one for the process: how long each D-state GPU holder has been in D
    pods = PodLister(  # one channel for the process; runtime and kubelet asked afresh every scan
        cri_socket, timeout=cri_timeout, kubelet_socket=pod_resources_socket, trust_runtime=trust_runtime
    )

    def scan() -> Any:
        return exporter.scan_node(
            procfs=Procfs(procfs),
            nvml=nvml,
            view=current_view(),
            names=names,
            resources=lambda: list_pod_resources(pod_resources_socket, cdi_dirs=cdi_dirs),
            baseline=None if baseline_mib is None else baseline_mib * MIB,
            threshold=ghost_threshold_mib * MIB,
            node_name=node_name,
            dstate=dstate,
            pods=pods,
        )

    def echo(line):
        return click.echo(line, err=True)

    on_result = _warn_on_change(exporter, echo, errors=not once)
    reaper = None
    if reap_after is not None:
        reaper = _reaper(
            exporter, reap_after, procfs, nvml, echo, cri_socket, cri_timeout, pod_resources_socket, trust_runtime
        )
        on_result = _both(on_result, reaper.observe)
    collector = exporter.NodeCollector(
        scan,
        min_interval=float("inf") if once else min_interval,
        on_result=on_result,
        unhealthy_after=serving["unhealthy_after"],
    )
    registry = CollectorRegistry()
    registry.register(collector)
    if reaper is not None:
        registry.register(reaper)
        reaper.start(collector.latest, every=max(min_interval, 1.0))
    if once:
        result = collector.latest()
        if result.scan is None:
            raise GpuzombieError(f"cannot scan {procfs}: {str(result.error)[:1000]}")  # main escapes it
        click.echo(generate_latest(registry).decode(), nl=False)
        return int(ExitStatus.OK)
    return _serve(exporter, registry, collector, serving, min_interval)
