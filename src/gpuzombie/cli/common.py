"""Options and output helpers shared by the commands, and the one wiring of the node every node
command (trace, top, the exporter, reap) reads it through: their shared options folded into one
``NodeOptions``, and the ``NodeParts`` built from it once (the procfs, NVML, the runtime's names,
the pod lister and the kubelet's PodResources)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuzombie.exitcodes import ExitStatus
from gpuzombie.k8s.cdi import DEFAULT_CDI_DIRS
from gpuzombie.k8s.names import CRI_TIMEOUT
from gpuzombie.k8s.names import SOCKET_ENV as CRI_SOCKET_ENV
from gpuzombie.k8s.podresources import DEFAULT_SOCKET
from gpuzombie.proc.own import PROCFS
from gpuzombie.units import MIB

if TYPE_CHECKING:  # imported lazily below: --help loads neither the NVML layer nor the runtime's clients
    from gpuzombie.gpu.nvml import NvmlBackend
    from gpuzombie.k8s.liveness import PodLister
    from gpuzombie.k8s.names import RuntimeNames
    from gpuzombie.k8s.podresources import PodResources
    from gpuzombie.proc.procfs import Procfs

CommandFn = TypeVar("CommandFn", bound=Callable[..., Any])

procfs_option = click.option(
    "--procfs",
    default=PROCFS,
    show_default=True,
    envvar="GPUZOMBIE_PROCFS",
    type=click.Path(file_okay=False),
    help="procfs root to read (a node agent reads /host/proc). Env: GPUZOMBIE_PROCFS.",
)
cri_socket_option = click.option(
    "--cri-socket",
    default=None,
    metavar="PATH",
    envvar=CRI_SOCKET_ENV,
    help="CRI runtime socket to ask for pod and container names (gRPC). Default: the first of "
    f"containerd's, CRI-O's and cri-dockerd's usual sockets that exists. Env: {CRI_SOCKET_ENV}.",
)
cri_timeout_option = click.option(
    "--cri-timeout",
    type=click.FloatRange(min=0.1),
    default=CRI_TIMEOUT,
    show_default=True,
    metavar="S",
    help="Give up on the CRI runtime after S seconds per scan (ids only, a warning).",
)
pod_resources_socket_option = click.option(
    "--pod-resources-socket",
    default=DEFAULT_SOCKET,
    show_default=True,
    metavar="PATH",
    envvar="GPUZOMBIE_POD_RESOURCES_SOCKET",
    help="kubelet PodResources socket: which pods the kubelet runs (no pod is called stale without "
    "it) and which GPU it gave each. Env: GPUZOMBIE_POD_RESOURCES_SOCKET.",
)
cdi_dir_option = click.option(
    "--cdi-dir",
    "cdi_dirs",
    multiple=True,
    default=DEFAULT_CDI_DIRS,
    show_default=True,
    metavar="DIR",
    envvar="GPUZOMBIE_CDI_DIRS",
    type=click.Path(file_okay=False),
    help="CDI spec directory, repeatable (later ones win): where a DRA driver's specs name the GPU "
    "node of each DRA device PodResources reports (NVIDIA's: /var/run/cdi). "
    "Env: GPUZOMBIE_CDI_DIRS, colon-separated.",
)
trust_runtime_option = click.option(
    "--trust-runtime-without-kubelet",
    "trust_runtime",
    is_flag=True,
    help="When the kubelet's PodResources cannot be read, judge stale pods from the CRI runtime alone "
    "(a runtime that is not the kubelet's then makes its live pods look stale). Never overrides a "
    "kubelet that answers.",
)
gpu_device_class_option = click.option(
    "--gpu-device-class",
    "gpu_device_classes",
    multiple=True,
    metavar="CLASS",
    help="A DRA device class that is a GPU, besides gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com "
    "and gpu.amd.com (repeat for more). The webhook takes it with --patch only: a pod under review "
    "names its claims, not their classes, so serving takes every claim for a GPU.",
)
tls_reload_option = click.option(
    "--tls-reload-seconds",
    type=click.FloatRange(min=0.1),
    default=30.0,
    hidden=True,
    help="How often the TLS files are checked for a renewed certificate (a server's, 30 s by default).",
)

image_archives_option = click.option(
    "--image-archives",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Import the pause and busybox images from these archives (made by `gpuzombie lab images`) "
    "instead of building them from this host's catatonit and busybox.",
)
"""The lab's commands that start a private containerd (lab run, lab pod, lab handover)."""


def json_option(schema: str, page: str) -> Callable[[CommandFn], CommandFn]:
    """``--json``, its help naming the schema id and the page of docs/ that documents it."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print JSON (schema {schema}, {page}).")


def _apply(fn: CommandFn, options: Iterable[Callable[[CommandFn], CommandFn]]) -> CommandFn:
    """``fn`` decorated with ``options`` as if stacked in that order above it (--help keeps the order)."""
    for option in reversed(tuple(options)):
        fn = option(fn)
    return fn


def node_source_options(fn: CommandFn) -> CommandFn:
    """Where a node command learns whose the processes are: the CRI runtime (pod and container names),
    the kubelet's PodResources (live pods, their GPUs) and the DRA driver's CDI specs; trace, top and
    the exporter take the same five options."""
    return _apply(
        fn, (cri_socket_option, cri_timeout_option, pod_resources_socket_option, cdi_dir_option, trust_runtime_option)
    )


def node_name_option(help_text: str) -> Callable[[CommandFn], CommandFn]:
    """--node-name (the host name unless NODE_NAME, which a DaemonSet sets from spec.nodeName)."""
    import socket

    return click.option(
        "--node-name",
        default=socket.gethostname,
        show_default="the host name",
        envvar="NODE_NAME",
        metavar="NAME",
        help=f"{help_text} Env: NODE_NAME.",
    )


def tls_pair(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A callback: --tls-cert and --tls-key come together; --tls-client-ca needs them."""
    params = ctx.params
    if param.name == "tls_client_ca" and value is not None and params.get("tls_cert") is None:
        raise click.BadParameter("needs --tls-cert and --tls-key")
    if param.name == "tls_key" and (value is None) != (params.get("tls_cert") is None):
        raise click.BadParameter("give --tls-cert and --tls-key together")
    return value


def server_options(*, cert_help: str, read_timeout: float, max_connections: int) -> Callable[[CommandFn], CommandFn]:
    """The options every server of gpuzombie (serving.Server: the exporter, the webhook) shares: its
    certificate and key (given together), the hidden reload interval, and its two connection bounds."""
    pem = click.Path(dir_okay=False)

    def decorate(fn: CommandFn) -> CommandFn:
        return _apply(
            fn,
            (
                click.option("--tls-cert", type=pem, default=None, metavar="PEM", help=cert_help),
                click.option(
                    "--tls-key", type=pem, default=None, metavar="PEM", callback=tls_pair, help="Its private key."
                ),
                tls_reload_option,
                click.option(
                    "--read-timeout",
                    type=click.FloatRange(min=0.1),
                    default=read_timeout,
                    show_default=True,
                    metavar="S",
                    help="A connection must send its whole request within S seconds (slow senders are cut).",
                ),
                click.option(
                    "--max-connections",
                    type=click.IntRange(min=1),
                    default=max_connections,
                    show_default=True,
                    metavar="N",
                    help="Serve at most N connections at once; at the bound a new one evicts the oldest "
                    "still sending its request.",
                ),
            ),
        )

    return decorate


def ghost_options(fn: CommandFn) -> CommandFn:
    """--ghost-threshold-mib, --baseline-mib and the hidden --nvml-replay: the GPU-memory options
    every command that judges ghost memory shares (observe, trace)."""
    from gpuzombie.gpu.attribution import DEFAULT_GHOST_THRESHOLD
    from gpuzombie.units import MIB

    return _apply(
        fn,
        (
            click.option(
                "--ghost-threshold-mib",
                type=click.IntRange(min=0),
                default=DEFAULT_GHOST_THRESHOLD // MIB,
                show_default=True,
                help="Flag a GPU when unexplained memory exceeds this.",
            ),
            click.option(
                "--baseline-mib",
                type=click.IntRange(min=0),
                default=None,
                help="Memory used with no process at all. Default: the driver's reservation from NVML.",
            ),
            click.option(
                "--nvml-replay",
                type=click.Path(dir_okay=False),
                default=None,
                hidden=True,
                help="Read NVML state from a JSON snapshot instead of the driver (tests, replays).",
            ),
        ),
    )


def nvml_backend(replay: str | None) -> NvmlBackend:
    """The real NVML, or a snapshot recorded as JSON (``--nvml-replay``)."""
    from gpuzombie.errors import GpuzombieError
    from gpuzombie.gpu.nvml import FakeNvml, default_backend

    if replay is None:
        return default_backend()
    try:
        with open(replay) as f:
            return FakeNvml.from_dict(json.load(f))
    except (OSError, ValueError, TypeError) as exc:
        raise GpuzombieError(f"cannot replay NVML snapshot {replay}: {exc}") from exc


def echo_json(value: Any) -> None:
    """A report as JSON on stdout, through the library's one serializer."""
    from gpuzombie.jsonout import dumps

    click.echo(dumps(value))


def echo_warnings(command: str, warnings: Iterable[str]) -> None:
    """Text mode's warnings, one line each on stderr: stdout holds the report alone (JSON keeps its own)."""
    from gpuzombie.escape import escape

    for warning in warnings:
        click.echo(f"gpuzombie {command}: warning: {escape(warning, 1000)}", err=True)


def check_node_inputs(procfs: str, *, who: str) -> None:
    """The checks every node command makes before its first scan: a readable procfs root, and root
    on the live /proc (other processes' fds and cgroups)."""
    from gpuzombie.errors import GpuzombieError
    from gpuzombie.proc.pidns import is_live_procfs
    from gpuzombie.proc.procfs import not_a_procfs

    if not os.path.isdir(procfs):
        raise GpuzombieError(f"procfs root {procfs} is not a directory")
    why = not_a_procfs(procfs)
    if why is not None:
        raise GpuzombieError(why)
    if is_live_procfs(procfs) and os.geteuid() != 0:
        raise GpuzombieError(f"{who} reads every process's fds and cgroup: run it as root")


def unreadable_procfs(procfs: str, exc: OSError | ValueError) -> Exception:
    """The one line for a procfs a scan could not read (ValueError: a tree whose stat has no btime line)."""
    from gpuzombie.errors import GpuzombieError

    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return GpuzombieError(f"cannot read {procfs}: {reason}")


def stopped(who: str, received: signal.Signals) -> int:
    """A server's last line once a signal stopped it, and its exit code: 0 for SIGTERM (how the
    kubelet stops a pod), 130 for SIGINT (Ctrl-C)."""
    click.echo(f"gpuzombie {who}: stopped ({received.name})", err=True)
    return int(ExitStatus.INTERRUPTED if received == signal.SIGINT else ExitStatus.OK)


def exact_command() -> list[str]:
    """The command with every option spelled out (the defaults too), so it reruns the same way."""
    ctx = click.get_current_context()
    argv = ctx.command_path.split()
    arguments: list[str] = []  # after every option, as a user types them
    for name, value in ctx.params.items():
        if value is not None:
            option = next(o for o in ctx.command.params if o.name == name)
            if isinstance(option, click.Argument):  # a file argument: its name, - for stdin
                name = getattr(value, "name", value) if not isinstance(value, str) else value
                arguments.append(name if isinstance(name, str) and name != "<stdin>" else "-")
                continue
            if isinstance(option, click.Option) and option.is_flag:
                argv += [option.opts[0]] if value else []
                continue
            for one in value if isinstance(value, tuple) else (value,):  # a repeated option
                argv += [option.opts[0], str(one)]
    return argv + arguments


@dataclass(frozen=True)
class NodeOptions:
    """The options a node command reads the node by, as the command line gave them."""

    procfs: str = PROCFS
    cri_socket: str | None = None
    cri_timeout: float = CRI_TIMEOUT
    pod_resources_socket: str = DEFAULT_SOCKET
    cdi_dirs: tuple[str, ...] = DEFAULT_CDI_DIRS
    trust_runtime: bool = False
    nvml_replay: str | None = None
    ghost_threshold_mib: int | None = None
    """None: the command takes no ghost options (``gpu.attribution.DEFAULT_GHOST_THRESHOLD``)."""
    baseline_mib: int | None = None

    @property
    def baseline(self) -> int | None:
        """--baseline-mib in bytes."""
        return None if self.baseline_mib is None else self.baseline_mib * MIB

    @property
    def threshold(self) -> int:
        """--ghost-threshold-mib in bytes."""
        if self.ghost_threshold_mib is None:
            from gpuzombie.gpu.attribution import DEFAULT_GHOST_THRESHOLD

            return DEFAULT_GHOST_THRESHOLD
        return self.ghost_threshold_mib * MIB


_FIELDS = frozenset(f.name for f in dataclasses.fields(NodeOptions))


def node_options(fn: Callable[..., int]) -> Callable[..., int]:
    """A command given its node options as one ``node: NodeOptions`` (the options themselves are
    declared by the decorators of ``cli.common``, above or below this one)."""

    @functools.wraps(fn)
    def command(**params: Any) -> int:
        given = {name: params.pop(name) for name in list(params) if name in _FIELDS}
        return fn(node=NodeOptions(**given), **params)

    return command


class NodeParts:
    """The node's parts, wired once from ``options`` (checked first: a procfs, root on the live one):
    each made at its first use, the channels closed on exit."""

    def __init__(self, options: NodeOptions, *, who: str) -> None:
        check_node_inputs(options.procfs, who=who)
        self.options = options

    def procfs(self) -> Procfs:
        from gpuzombie.proc.procfs import Procfs

        return Procfs(self.options.procfs)

    @cached_property
    def nvml(self) -> NvmlBackend:
        """One backend for the process: NVML is initialised once."""
        return nvml_backend(self.options.nvml_replay)

    @cached_property
    def names(self) -> RuntimeNames:
        """One for the process: names are kept across scans."""
        from gpuzombie.k8s.names import RuntimeNames

        return RuntimeNames(self.options.cri_socket, timeout=self.options.cri_timeout)

    @cached_property
    def pods(self) -> PodLister:
        """One channel for the process; the runtime and the kubelet are asked afresh every call."""
        from gpuzombie.k8s.liveness import PodLister

        o = self.options
        return PodLister(
            o.cri_socket, timeout=o.cri_timeout, kubelet_socket=o.pod_resources_socket, trust_runtime=o.trust_runtime
        )

    def resources(self) -> PodResources:
        """The kubelet's PodResources, asked now."""
        from gpuzombie.k8s.podresources import list_pod_resources

        return list_pod_resources(self.options.pod_resources_socket, cdi_dirs=self.options.cdi_dirs)

    def __enter__(self) -> NodeParts:
        return self

    def __exit__(self, *exc: object) -> None:
        for channel in ("pods", "names"):
            if channel in self.__dict__:
                self.__dict__[channel].close()
