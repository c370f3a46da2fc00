"""`gpuzombie webhook`: the mutating admission webhook for GPU pods (HTTPS, POST /mutate), or with
--patch the same mutation applied offline to manifests (docs/admission.md)."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuzombie.admission.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REVIEWS, DEFAULT_REVIEW_SECONDS
from gpuzombie.cli.common import (
    choice_option,
    count_option,
    gpu_device_class_option,
    seconds_option,
    server_options,
    stopped,
)
from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus

DEFAULT_LISTEN = "127.0.0.1:8443"
CONFIG_KEYS = frozenset({"image"})
"""What --config FILE may set (a YAML map)."""


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


def _policy(
    mode: str, image: str, namespace: str | None, skip: tuple[str, ...], opt_ins: Any, preflight: bool = False
) -> Any:
    from gpuzombie.admission.mutate import ALWAYS_SKIPPED_NAMESPACES, Mode, Policy

    skipped = ALWAYS_SKIPPED_NAMESPACES | set(skip) | ({namespace} if namespace else set())
    return Policy(
        image=image,
        mode=Mode(mode),
        skip_namespaces=frozenset(skipped),
        namespace_opt_ins=opt_ins,
        preflight=preflight,
    )


def _configured_image(image: str | None, config: str | None) -> str | None:
    """--image (or its variable), else the configuration file's ``image:``; None when neither says."""
    if image or not config:
        return image
    import json

    from gpuzombie.cli.check import read_input, require_admission_extra

    text = read_input(config)
    try:  # JSON needs no extra (the webhook's image has no PyYAML); YAML does
        settings = json.loads(text)
    except ValueError:
        require_admission_extra("yaml")
        import yaml

        try:
            settings = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise GpuzombieError(f"{config}: not YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(settings, dict) or set(settings) - CONFIG_KEYS:
        raise GpuzombieError(f"{config}: expected a map with the keys {', '.join(sorted(CONFIG_KEYS))}")
    chosen = settings.get("image")
    if chosen is not None and (not isinstance(chosen, str) or not chosen.strip()):
        raise GpuzombieError(f"{config}: image: expected an image reference, got {chosen!r}")
    return chosen


def _image_hint() -> str:
    from gpuzombie import __version__

    return f"--image REGISTRY/gpu-zombie/gpuzombie-node:{__version__}"


def _patch(
    sources: tuple[str, ...],
    policy: Any,
    in_place: bool,
    gpu_device_classes: tuple[str, ...],
    image_defaulted: bool = False,
) -> int:
    """Each input's fix: printed (one input), or written back to the files it changes (--in-place).
    ``image_defaulted``: the policy's image is the chart's default (a printed --patch given none)."""
    from gpuzombie.cli.check import MAX_INPUT_BYTES, SUFFIXES, read_input, require_admission_extra

    require_admission_extra("yaml", "ruamel.yaml")
    from gpuzombie.admission.gitops import PatchError, patch_text
    from gpuzombie.admission.inplace import Manifest, Skipped, read_tree, write_back
    from gpuzombie.k8s.podspec.fields import ManifestError
    from gpuzombie.k8s.podspec.gpus import GPU_DEVICE_CLASSES

    classes = GPU_DEVICE_CLASSES | set(gpu_device_classes)
    if in_place and "-" in sources:
        raise click.UsageError("--in-place writes files back: stdin (-) has nowhere to go")
    if "-" in sources and len(sources) > 1:
        raise click.UsageError(f"--patch prints one input ({len(sources)} given): write them back with --in-place")
    skipped: list[Skipped] = []
    if sources == ("-",):
        inputs = [Manifest.of_text("-", read_input("-"))]
    else:  # as --in-place would write them: no link below the working directory followed
        inputs, skipped = read_tree(sources, SUFFIXES, MAX_INPUT_BYTES)
    if not in_place and len(inputs) + len(skipped) != 1:
        given = len(inputs) + len(skipped)
        raise click.UsageError(f"--patch prints one input ({given} given): write them back with --in-place")
    if not in_place and skipped:
        raise GpuzombieError(f"cannot read {skipped[0].shown}: {skipped[0].why}")
    results = []
    for source in inputs:  # every input is read and fixed before any is written
        shown = "stdin" if source.shown == "-" else source.shown
        try:
            result = patch_text(source.text, policy, classes)
        except (ManifestError, PatchError) as exc:
            raise GpuzombieError(f"{shown}: {exc}") from exc
        if result.needs_image and not policy.image:  # --in-place: the image goes into the repository
            raise GpuzombieError(
                f"{shown}: {result.needs_image[0]}: the fix adds an init container of gpuzombie's image, "
                f"which --in-place writes into the file: give your registry's with {_image_hint()} "
                "(or GPUZOMBIE_WEBHOOK_IMAGE, or image: in --config FILE)"
            )
        results.append((source, result))
    for _, result in results:
        for line in result.warnings:
            click.echo(f"gpuzombie webhook: {escape(line, 4096)}", err=True)
        if image_defaulted and result.needs_image:
            click.echo(
                f"gpuzombie webhook: the init container's image is {policy.image}, the chart's default (what "
                f"`make image` builds; a node has it only where it was built or imported): {_image_hint()} "
                "for your registry's",
                err=True,
            )
    if not in_place:
        sys.stdout.write(results[0][1].text)
        return int(ExitStatus.OK)
    changes = [(source, result.text) for source, result in results if result.text != source.text]
    done = write_back(changes, MAX_INPUT_BYTES)  # a file with nothing to fix is not written at all
    for path in done.written:
        click.echo(f"gpuzombie webhook: patched {escape(path)}", err=True)
    for skip in [*skipped, *done.skipped]:
        covered = " (what it names is patched under its own name)" if skip.covered else ""
        click.echo(f"gpuzombie webhook: skipped {escape(skip.shown)}: {escape(skip.why)}{covered}", err=True)
    if done.error is not None:
        raise GpuzombieError(done.error)
    left = [s for s in [*skipped, *done.skipped] if not s.covered]
    return int(ExitStatus.FINDINGS if left else ExitStatus.OK)


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
@click.option(
    "--patch",
    "patch_sources",
    multiple=True,
    metavar="FILE|DIR|-",
    help="Print FILE's manifests with the fix (only the fixed lines change) and exit; repeatable with --in-place.",
)
@click.option(
    "--in-place",
    is_flag=True,
    help="With --patch: write the fix back into each file (a directory's *.yaml, *.yml, *.json); "
    "files with nothing to fix are not written. No symbolic link below the working directory is "
    "followed; owner, mode and line ends are kept; read-only and hard-linked files are skipped; "
    "nothing is written if a file changed during the run or cannot be written.",
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    envvar="GPUZOMBIE_WEBHOOK_CONFIG",
    metavar="FILE",
    help="A YAML map of settings, today `image: IMAGE` (--image wins). Env: GPUZOMBIE_WEBHOOK_CONFIG.",
)
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    callback=_listen,
    metavar="HOST:PORT",
    envvar="GPUZOMBIE_WEBHOOK_LISTEN",
    help="Address to serve HTTPS on (in a pod: its pod IP). Env: GPUZOMBIE_WEBHOOK_LISTEN.",
)
@choice_option(
    "--mode",
    ["mutate", "warn"],
    "mutate",
    help="warn: change nothing, only send the warnings of what would be done.",
)
@click.option(
    "--image",
    envvar="GPUZOMBIE_WEBHOOK_IMAGE",
    metavar="IMAGE",
    help="Image of the injected init containers (ships /usr/bin/tini-static, /opt/gpuzombie/prestop.pyz and "
    "/opt/gpuzombie/preflight.pyz), e.g. REGISTRY/gpu-zombie/gpuzombie-node:VERSION: required to serve and "
    "for --patch --in-place where the fix adds one; a printed --patch defaults to the chart's default image, "
    "localhost/gpu-zombie/gpuzombie-node:VERSION (said on stderr). Env: GPUZOMBIE_WEBHOOK_IMAGE.",
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
    "torchrun-shutdown=true, preflight=true (repeatable; a pod's annotation wins).",
)
@click.option(
    "--preflight",
    is_flag=True,
    help="Inject the handover gate (gpuzombie preflight, first init container) into every GPU pod, not "
    'only those opted in; a pod annotated gpuzombie.dev/preflight: "false" is left out; shared GPUs never '
    "(docs/handover.md).",
)
@gpu_device_class_option
@server_options(
    cert_help="Server certificate (required to serve).",
    read_timeout=5.0,
    max_connections=64,
)
@count_option(
    "--max-body-bytes", DEFAULT_MAX_BODY_BYTES, least=1024, help="Refuse AdmissionReviews larger than N bytes (413)."
)
@count_option(
    "--max-body-bytes-held",
    4 * DEFAULT_MAX_BODY_BYTES,
    least=1024,
    help="The bodies of all connections together: one past it is refused (503), unread (a memory bound).",
)
@seconds_option(
    "--review-seconds",
    DEFAULT_REVIEW_SECONDS,
    least=0.01,
    help="One review's time (a wait for a slot included): past it the pod is admitted unchanged, with a warning.",
)
@count_option(
    "--max-reviews",
    DEFAULT_MAX_REVIEWS,
    least=1,
    help="Reviews analysed at once; more wait for a slot within --review-seconds (429 past it).",
)
def command(
    patch_sources: tuple[str, ...],
    in_place: bool,
    config: str | None,
    mode: str,
    image: str | None,
    namespace: str | None,
    skip_namespace: tuple[str, ...],
    opt_in: dict[str, dict[str, str]],
    preflight: bool,
    max_body_bytes: int,
    review_seconds: float,
    max_reviews: int,
    gpu_device_classes: tuple[str, ...],
    **serving: Any,
) -> int:
    """Serve the mutating admission webhook that fixes GPU pods nobody rebuilt: a container with
    `command` runs under tini (copied in by an init container), one that relies on its image's
    ENTRYPOINT gets `shareProcessNamespace: true` (no registry lookup), each with a warning.

    Leaves alone non-GPU pods, containers that run an init, Windows and hostPID pods, kube-system
    and --namespace, pods annotated gpuzombie.dev/inject: "false" or already mutated. Never denies
    a pod. With --patch FILE|- it prints the manifests with the fix instead (GitOps): comments, key
    order, quoting, block scalars and anchors are kept, and only the fixed lines change.

    \b
    A container with `command` gets an init container of gpuzombie's image,
    so name your registry's (as the chart's image.registry does):
      gpuzombie webhook --patch FILE \\
        --image REGISTRY/gpu-zombie/gpuzombie-node:VERSION
    --in-place needs it; a printed --patch without it takes the chart's
    default, localhost/gpu-zombie/gpuzombie-node:VERSION, and says so.

    A DRA claim is a GPU there when its claim or template in the input has a GPU device class
    (--gpu-device-class adds classes); serving, every claim is taken for one (a pod names no class).

    Exit 0 when stopped by SIGTERM (or --patch done), 1 when --in-place skipped a file (each named:
    a symbolic link, a read-only or hard-linked file), 2 on a bad flag, no image where one is needed,
    unreadable, encrypted or expired TLS files, unreadable input, a file changed during an --in-place
    run or not writable (then nothing is written), a port in use; 130 on Ctrl-C.
    """
    chosen = _configured_image(image, config)
    # A printed --patch is a preview (a diff, `| gpuzombie lab pod -`): it may take the chart's default
    # image. --in-place writes the image into a repository that clusters apply, and serving puts it in
    # every GPU pod: there a reference no node can pull must be chosen, not defaulted (docs/admission.md).
    defaulted = bool(patch_sources) and not in_place and not chosen
    if defaulted:
        from gpuzombie.admission.mutate import DEFAULT_IMAGE

        chosen = DEFAULT_IMAGE
    policy = _policy(mode, chosen or "", namespace, skip_namespace, opt_in, preflight)
    if in_place and not patch_sources:
        raise click.UsageError("--in-place goes with --patch")
    if patch_sources:
        return _patch(patch_sources, policy, in_place, gpu_device_classes, image_defaulted=defaulted)
    if gpu_device_classes:
        raise click.UsageError(
            "--gpu-device-class goes with --patch: a pod under review names its DRA claims, not their "
            "device classes, so the serving webhook takes every claim for a GPU (docs/admission.md)"
        )
    if not serving["tls_cert"] or not serving["tls_key"]:
        raise click.UsageError("serving needs --tls-cert and --tls-key (the API server calls webhooks over HTTPS)")
    if not chosen:
        raise click.UsageError(
            f"serving needs {_image_hint()} (or GPUZOMBIE_WEBHOOK_IMAGE, or image: in --config; the chart passes it)"
        )
    from gpuzombie.admission.app import make_app

    def log(line: str) -> None:
        click.echo(f"gpuzombie webhook: {line}", err=True)

    app = make_app(
        policy, max_body_bytes=max_body_bytes, review_seconds=review_seconds, max_reviews=max_reviews, log=log
    )
    return _serve(app, serving, max_body_bytes)
