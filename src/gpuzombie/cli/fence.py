"""`gpuzombie fence`: a DRA DeviceTaintRule (NoSchedule) on each GPU the fleet's verdict calls dirty,
lifted once it reads clean (docs/handover.md, "The fence")."""

from __future__ import annotations

from typing import Any

import click

from gpuzombie.cli.common import count_option, echo_json, json_option, seconds_option, stopped
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.exitcodes import ExitStatus

DEFAULT_LISTEN = "127.0.0.1:9845"


def _import() -> Any:
    try:
        from gpuzombie.fence import controller
    except ImportError as exc:
        raise GpuzombieError(needs_extra("the fence", "exporter", exc)) from exc
    return controller


@click.command()
@click.option(
    "--prometheus",
    required=True,
    metavar="URL",
    envvar="GPUZOMBIE_FENCE_PROMETHEUS",
    help="Prometheus that scrapes the node agents (http://prometheus.monitoring:9090). Env: GPUZOMBIE_FENCE_PROMETHEUS.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="KUBECONFIG",
    help="Credentials for the API server. Default: the pod's service account. Env: KUBECONFIG.",
)
@click.option(
    "--driver",
    "drivers",
    multiple=True,
    default=("gpu.nvidia.com",),
    show_default=True,
    metavar="NAME",
    help="DRA driver whose devices are GPUs (matched by their uuid attribute); repeatable.",
)
@seconds_option("--interval", 15.0, least=1, help="Seconds between evaluations.")
@count_option(
    "--clean-evaluations",
    3,
    least=1,
    help="Lift a rule once its GPU read clean at N evaluations in a row (read from Prometheus's history).",
)
@count_option(
    "--max-devices",
    10,
    least=0,
    help="Fence at most N devices in all; past it a dirty GPU is counted in gpuzombie_fence_limited_gpus instead.",
)
@click.option(
    "--max-node-percent",
    type=click.FloatRange(min=0, max=100),
    default=50.0,
    show_default=True,
    metavar="P",
    help="Fence at most P % of a node's devices (rounded down).",
)
@click.option("--dry-run", is_flag=True, help="Change nothing: print the rules it would create and delete.")
@click.option("--once", is_flag=True, help="One evaluation, reported, then exit (with --dry-run: a preview).")
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    envvar="GPUZOMBIE_FENCE_LISTEN",
    help="Where /metrics and /healthz are served while it runs (not with --once). Env: GPUZOMBIE_FENCE_LISTEN.",
)
@json_option("gpuzombie.fence/1", "docs/handover.md")
def command(
    prometheus: str,
    kubeconfig: str | None,
    drivers: tuple[str, ...],
    interval: float,
    clean_evaluations: int,
    max_devices: int,
    max_node_percent: float,
    dry_run: bool,
    once: bool,
    listen: str,
    as_json: bool,
) -> int:
    """Keep the scheduler off dirty GPUs: for each GPU whose gpuzombie_gpu_handover_clean is 0 while a
    stale, foreign, D-state or ghost holder keeps memory on it (from Prometheus), create one
    DeviceTaintRule (resource.k8s.io/v1, taint gpuzombie.dev/dirty, NoSchedule) on its DRA device,
    found by UUID in the node's ResourceSlices; delete it once the GPU read clean at
    --clean-evaluations evaluations in a row. Only rules it made (its label
    app.kubernetes.io/managed-by=gpuzombie-fence) are ever deleted. No local state: every
    evaluation starts from the API server's rules.

    Fails safe: Prometheus unreachable changes nothing (one log line, gpuzombie_fence_verdicts_available
    0); a fenced GPU without a verdict keeps its rule.

    Exit (--once): 0 evaluated, every dirty GPU fenced; 1 something left undone: the verdicts
    unavailable, a limit reached, a dirty GPU with no DRA device, or a create/delete refused;
    2 usage or environment error (the API server unreachable or refusing). Running: 0 on SIGTERM.
    """
    controller = _import()
    from gpuzombie.fence.decide import Limits
    from gpuzombie.fence.verdicts import Prometheus
    from gpuzombie.k8s.apiserver import ApiServer

    settings = controller.Settings(
        drivers=drivers,
        limits=Limits(max_devices=max_devices, max_node_percent=max_node_percent),
        clean_evaluations=clean_evaluations,
        interval=interval,
        dry_run=dry_run,
    )
    api = ApiServer.connect(kubeconfig)

    def log(line: str) -> None:
        click.echo(f"gpuzombie fence: {line}", err=True)

    fence = controller.Fence(api, Prometheus(prometheus), settings, log=log if not (once and as_json) else _quiet)
    if once:
        outcome = fence.evaluate()
        if as_json:
            echo_json(controller.report(outcome))
        else:
            _print(outcome)
        return int(_status(outcome))
    return _run(controller, fence, listen, log)


def _quiet(line: str) -> None:
    """--once --json: the report says it all; stdout stays one document."""


def _status(outcome: Any) -> ExitStatus:
    plan = outcome.plan
    if plan is None or outcome.errors or plan.limited or plan.unmapped:
        return ExitStatus.FINDINGS
    return ExitStatus.OK


def _print(outcome: Any) -> None:
    if outcome.plan is None:
        click.echo(f"verdicts unavailable, nothing changed: {outcome.skipped}")
        return
    plan = outcome.plan
    verb = "would create" if outcome.dry_run else "created"
    for create in plan.create:
        if outcome.dry_run or create.name in outcome.created:
            d, r = create.device, create.reading
            click.echo(
                f"{verb} {create.name}: {d.driver}/{d.pool}/{d.name} (node {r.node}, {r.uuid}, "
                f"{r.held_bytes // 2**20} MiB held by {','.join(h for h, _ in r.held)})"
            )
    for rule in plan.delete:
        if outcome.dry_run or rule.name in outcome.deleted:
            click.echo(
                f"{'would delete' if outcome.dry_run else 'deleted'} {rule.name} (node {rule.node}, {rule.uuid}): clean"
            )
    for held in (*plan.limited, *plan.unmapped):
        click.echo(f"not fenced: node {held.reading.node} {held.reading.uuid}: {held.why}")
    for line in outcome.errors:
        click.echo(f"error: {line}")
    click.echo(
        f"{len(plan.keep) + len(outcome.created)} rule(s) of the fence's, {plan.foreign_rules} of others; "
        f"{outcome.api_calls} API call(s), {outcome.seconds:.3f} s"
    )


def _run(controller: Any, fence: Any, listen: str, log: Any) -> int:
    import threading

    from prometheus_client import CollectorRegistry

    from gpuzombie.exporter import ListenError, PrometheusExporter, parse_listen
    from gpuzombie.serving import serve_until_stopped

    try:
        address = parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    registry = CollectorRegistry()
    metrics = controller.Metrics(registry)
    stop = threading.Event()
    loop = threading.Thread(target=fence.run, args=(stop, metrics), name="gpuzombie-fence", daemon=True)
    server = PrometheusExporter(
        registry,
        listen=address,
        probes={"/healthz": lambda: (loop.is_alive(), "evaluating" if loop.is_alive() else "the loop stopped")},
    )

    def announce(server: Any) -> None:
        urls = " and ".join(f"http://{bound}/metrics" for bound in server.bound)
        s = fence.settings
        log(
            f"serving {urls}; every {s.interval:g} s, drivers {', '.join(s.drivers)}, lifted after "
            f"{s.clean_evaluations} clean evaluation(s), at most {s.limits.max_devices} device(s) and "
            f"{s.limits.max_node_percent:g} % of a node{' (dry run)' if s.dry_run else ''}"
        )
        loop.start()

    try:
        received = serve_until_stopped(server, announce=announce, log=log, tls_check_seconds=3600)
    except ListenError as exc:
        raise GpuzombieError(str(exc)) from exc
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(timeout=fence.api.timeout + 15)
    return stopped("fence", received)
