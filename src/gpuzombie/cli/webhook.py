"""`gpuzombie webhook`: the mutating admission webhook for GPU pods (HTTPS, POST /mutate), or with
--patch the same mutation applied offline to manifests (docs/admission.md)."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuzombie.admission.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REVIEWS, DEFAULT_REVIEW_SECONDS
from gpuzombie.admission.mutate import DEFAULT_IMAGE
from gpuzombie.cli.common import stopped, tls_reload_option
from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus

DEFAULT_LISTEN = "127.0.0.1:8443"


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    from gpuzombie.serving import parse_listen

    try:
        return parse_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _opt_ins(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, dict[str, str]]:
    from gpuzombie.admission.mutate import OPT_INS

    out: dict[str, dict[str, str]] = {}
    for value in values:
        namespace, sep, setting = value.partition(":")
        key, eq, chosen = setting.partition("=")
        if not sep or not eq or not namespace or key not in OPT_INS:
            raise click.BadParameter(f"{value!r} is not NAMESPACE:KEY=VALUE with KEY one of {', '.join(OPT_INS)}")
        out.setdefault(namespace, {})[key] = chosen
    return out


def _policy(mode: str, image: str, namespace: str | None, skip: tuple[str, ...], opt_ins: Any) -> Any:
    from gpuzombie.admission.mutate import ALWAYS_SKIPPED_NAMESPACES, Mode, Policy

    skipped = ALWAYS_SKIPPED_NAMESPACES | set(skip) | ({namespace} if namespace else set())
    return Policy(image=image, mode=Mode(mode), skip_namespaces=frozenset(skipped), namespace_opt_ins=opt_ins)


def patch_manifests(text: str, policy: Any) -> tuple[list[Any], list[str]]:
    """The documents of ``text`` with every pod fixed in place, and the warnings (one line each)."""
    import jsonpatch

    from gpuzombie.admission import manifests
    from gpuzombie.admission.mutate import mutate

    documents = manifests.load_documents(text)
    by_index = {d.index: d.data for d in documents}
    warnings: list[str] = []
    for ref in list(manifests.pods(documents)):
        try:
            mutation = mutate(ref.pod, ref.namespace, policy)
        except ValueError as exc:
            warnings.append(f"{ref.label}: could not understand the pod ({exc}); left unchanged")
            continue
        warnings += [f"{ref.label}: {w}" for w in mutation.warnings]
        if mutation.skipped and mutation.skipped != "no GPU container":
            warnings.append(f"{ref.label}: left alone: {mutation.skipped}")
        ops = [{**op, "path": ref.pointer + op["path"]} for op in mutation.ops]
        if ops:
            by_index[ref.document] = jsonpatch.apply_patch(by_index[ref.document], ops)
    return [by_index[d.index] for d in documents], warnings


def _patch(source: str, policy: Any) -> int:
    from gpuzombie.cli.check import read_inputs, require_admission_extra

    require_admission_extra("yaml", "jsonpatch")
    import yaml

    from gpuzombie.admission.manifests import ManifestError

    ((path, text),) = read_inputs((source,))
    try:
        documents, warnings = patch_manifests(text, policy)
    except ManifestError as exc:
        raise GpuzombieError(f"{'stdin' if path == '-' else path}: {exc}") from exc
    for line in warnings:
        click.echo(f"gpuzombie webhook: {line}", err=True)
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False, explicit_start=len(documents) > 1, width=4096))
    return int(ExitStatus.OK)


def _serve(app: Any, serving: dict[str, Any], max_body_bytes: int) -> int:
    from gpuzombie.serving import Server, TlsFiles, serve_until_stopped

    server = Server(
        {"/mutate": app},
        listen=serving["listen"],
        tls=TlsFiles(serving["tls_cert"], serving["tls_key"]),
        probes={"/healthz": lambda: (True, "ok"), "/readyz": lambda: (True, "ready")},
        read_timeout=serving["read_timeout"],
        max_connections=serving["max_connections"],
        max_body_bytes=max_body_bytes,  # the server's 413 and the app's own bound agree
        max_body_bytes_held=serving["max_body_bytes_held"],
        name="gpuzombie-webhook",
    )

    def log(line: str) -> None:
        click.echo(f"gpuzombie webhook: {line}", err=True)

    try:
        received = serve_until_stopped(
            server,
            announce=lambda s: log(f"serving https://{s.bound[0]}/mutate, /healthz and /readyz"),
            log=log,
            tls_check_seconds=serving["tls_reload_seconds"],
        )
    except OSError as exc:
        raise GpuzombieError(f"cannot serve TLS on {serving['listen']}: {exc.strerror or exc}") from exc
    return stopped("webhook", received)


@click.command()
@click.option("--patch", "patch_source", metavar="FILE|-", help="Print FILE's manifests mutated (YAML) and exit.")
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    callback=_listen,
    metavar="HOST:PORT",
    envvar="GPUZOMBIE_WEBHOOK_LISTEN",
    help="Address to serve HTTPS on (in a pod: its pod IP). Env: GPUZOMBIE_WEBHOOK_LISTEN.",
)
@click.option(
    "--tls-cert", type=click.Path(dir_okay=False), metavar="PEM", help="Server certificate (required to serve)."
)
@click.option("--tls-key", type=click.Path(dir_okay=False), metavar="PEM", help="Its private key.")
@click.option(
    "--mode",
    type=click.Choice(["mutate", "warn"]),
    default="mutate",
    show_default=True,
    help="warn: change nothing, only send the warnings of what would be done.",
)
@click.option(
    "--image",
    default=DEFAULT_IMAGE,
    show_default=True,
    envvar="GPUZOMBIE_WEBHOOK_IMAGE",
    metavar="IMAGE",
    help="Image of the injected init container (ships /usr/bin/tini-static and /opt/gpuzombie/prestop.pyz).",
)
@click.option(
    "--namespace",
    envvar="POD_NAMESPACE",
    metavar="NS",
    help="The webhook's own namespace, left alone (as kube-system always is). Env: POD_NAMESPACE.",
)
@click.option("--skip-namespace", multiple=True, metavar="NS", help="Leave this namespace's pods alone (repeatable).")
@click.option(
    "--opt-in",
    multiple=True,
    callback=_opt_ins,
    metavar="NS:KEY=VALUE",
    help="A namespace's default for the pod annotation gpuzombie.dev/KEY: prestop=true, grace-seconds=N, "
    "torchrun-shutdown=true (repeatable; a pod's annotation wins).",
)
@tls_reload_option
@click.option("--read-timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True, metavar="S")
@click.option("--max-connections", type=click.IntRange(min=1), default=64, show_default=True, metavar="N")
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    metavar="N",
    help="Refuse AdmissionReviews larger than N bytes (413).",
)
@click.option(
    "--max-body-bytes-held",
    type=click.IntRange(min=1024),
    default=4 * DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    metavar="N",
    help="The bodies of all connections together: one past it is refused (503), unread (a memory bound).",
)
@click.option(
    "--review-seconds",
    type=click.FloatRange(min=0.01),
    default=DEFAULT_REVIEW_SECONDS,
    show_default=True,
    metavar="S",
    help="One review's time (a wait for a slot included): past it the pod is admitted unchanged, with a warning.",
)
@click.option(
    "--max-reviews",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_REVIEWS,
    show_default=True,
    metavar="N",
    help="Reviews analysed at once; more wait for a slot within --review-seconds (429 past it).",
)
def command(
    patch_source: str | None,
    mode: str,
    image: str,
    namespace: str | None,
    skip_namespace: tuple[str, ...],
    opt_in: dict[str, dict[str, str]],
    max_body_bytes: int,
    review_seconds: float,
    max_reviews: int,
    **serving: Any,
) -> int:
    """Serve the mutating admission webhook that fixes GPU pods nobody rebuilt: a container with
    `command` runs under tini (copied in by an init container), one that relies on its image's
    ENTRYPOINT gets `shareProcessNamespace: true` (no registry lookup), each with a warning.

    Leaves alone non-GPU pods, containers that run an init, Windows and hostPID pods, kube-system
    and --namespace, pods annotated gpuzombie.dev/inject: "false" or already mutated. Never denies
    a pod. With --patch FILE|- it prints the mutated manifests instead (GitOps).

    Exit 0 when stopped by SIGTERM (or --patch printed), 2 on a bad flag, unreadable, encrypted or
    expired TLS files, unreadable input, a port in use; 130 on Ctrl-C.
    """
    policy = _policy(mode, image, namespace, skip_namespace, opt_in)
    if patch_source is not None:
        return _patch(patch_source, policy)
    if not serving["tls_cert"] or not serving["tls_key"]:
        raise click.UsageError("serving needs --tls-cert and --tls-key (the API server calls webhooks over HTTPS)")
    from gpuzombie.admission.app import make_app

    def log(line: str) -> None:
        click.echo(f"gpuzombie webhook: {line}", err=True)

    app = make_app(
        policy, max_body_bytes=max_body_bytes, review_seconds=review_seconds, max_reviews=max_reviews, log=log
    )
    return _serve(app, serving, max_body_bytes)
