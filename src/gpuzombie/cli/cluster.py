"""``gpuzombie cluster``: a real single-node Kubernetes on this machine (the upstream control plane
and kubelet built from their Go modules, a private containerd, CNI bridge networking), to run the lab
and the tests against. docs/kubernetes.md says what runs and why each setting differs from upstream."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from types import ModuleType
from typing import Any

import click

from gpuzombie.cluster.build import ensure_binary, ensure_containerd, ensure_nri_plugin
from gpuzombie.cluster.layout import Layout
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.jsonout import dumps


def _progress(line: str) -> None:
    click.echo(f"cluster: {line}", err=True)


def _node() -> ModuleType:
    """cluster.node, imported when a command runs: it needs the cluster and node extras (the PKI's
    cryptography, the CRI client's grpcio), which `gpuzombie --help` must not."""
    try:
        from gpuzombie.cluster import node
    except ImportError as exc:
        raise GpuzombieError(needs_extra("gpuzombie cluster", "cluster,node", exc)) from None
    return node


def _state_or_fail(layout: Layout) -> Any:
    state = _node().ClusterState.read(layout.state_file)
    if state is None:
        raise GpuzombieError(f"no cluster at {layout.root} (gpuzombie cluster up starts one)")
    return state


@click.group(short_help="Start, inspect and stop a real single-node Kubernetes here.")
def command() -> None:
    """A real single-node Kubernetes on this machine: kube-apiserver, kube-controller-manager,
    kube-scheduler, etcd and the kubelet (one binary built from the Go modules go/kube pins, cached
    in ~/.cache/gpuzombie/kube), on a private containerd with CNI bridge networking. Needs root.
    Everything lives under $GPUZOMBIE_CLUSTER_DIR (default /var/lib/gpuzombie-cluster)."""


@command.command("build")
@click.option(
    "--containerd2",
    is_flag=True,
    help="Also containerd 2 (go/containerd: containerd, its runc shim, ctr; cached in ~/.cache/gpuzombie/containerd).",
)
@click.option(
    "--nri",
    "nri",
    is_flag=True,
    help="Also the NRI plugin (go/nri: gpuzombie-nri, tini for GPU containers in containerd; cached in ~/.cache/gpuzombie/nri).",
)
def build_command(containerd2: bool, nri: bool) -> None:
    """Build (or find in the cache) the multi-call Kubernetes binary; print its path (and the
    directory of containerd 2's binaries, the NRI plugin's path)."""
    click.echo(ensure_binary(_progress))
    if containerd2:
        click.echo(ensure_containerd(_progress))
    if nri:
        click.echo(ensure_nri_plugin(_progress))


@command.command("up")
def up_command() -> None:
    """Start the node; exit 0 once it is Ready. The last line on stdout is the kubeconfig's path.
    GPUZOMBIE_CLUSTER_RUNTIME=containerd2 runs it on containerd 2 (built from go/containerd)."""
    layout = Layout.from_env()
    state = _node().up(layout, layout.ports, _progress)
    _progress(
        f"node Ready in {state.ready_s:.1f} s (Kubernetes {state.kubernetes_version}, containerd {state.containerd_version})"
    )
    click.echo(state.kubeconfig)


@command.command("node-image")
def node_image_command() -> None:
    """Build the chart's node image from this machine's files (cached) and import it into the
    running cluster's containerd; print its name."""
    layout = Layout.from_env()
    _state_or_fail(layout)
    node = _node()
    from gpuzombie.cluster.images import node_image_archive  # needs what node needs

    name, archive = node_image_archive(_progress)
    node.import_archive(layout, name, archive)
    click.echo(name)


@command.command("down")
def down_command() -> None:
    """Stop the cluster and remove every process, mount, cgroup, interface and iptables chain it made."""
    layout = Layout.from_env()
    existed = layout.root.exists()
    problems = _node().down(layout)
    if problems:
        raise GpuzombieError("cluster down left: " + "; ".join(problems))
    _progress(f"removed {layout.root}" if existed else f"nothing at {layout.root}")


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status_command(as_json: bool) -> None:
    """What runs, where the kubeconfig is, which versions. Exit 0 when up, 1 when not."""
    result = _node().status(Layout.from_env())
    if as_json:
        click.echo(dumps(result))
    elif not result.processes:
        click.echo(f"no cluster at {result.root}")
    else:
        click.echo(f"cluster at {result.root}: {'up' if result.up else 'NOT up'}")
        click.echo(f"  Kubernetes {result.kubernetes_version}, containerd {result.containerd_version}")
        click.echo(f"  kubeconfig {result.kubeconfig}")
        for name, running in result.processes.items():
            click.echo(f"  {name:<24} {'running' if running else 'gone'}")
    sys.exit(ExitStatus.OK if result.up else ExitStatus.FINDINGS)


@command.command("env")
def env_command() -> None:
    """The export lines that point a shell (kubectl, trace, top, exporter, reap) at the cluster."""
    layout = Layout.from_env()
    state = _state_or_fail(layout)
    for name, value in (
        ("KUBECONFIG", state.kubeconfig),
        ("GPUZOMBIE_CRI_SOCKET", str(layout.containerd_socket)),
        ("GPUZOMBIE_POD_RESOURCES_SOCKET", str(layout.pod_resources_socket)),
        ("PATH", f"{layout.bin}:{os.environ.get('PATH', '')}"),
    ):
        click.echo(f"export {name}={shlex.quote(value)}")
    if layout.nri_socket.is_socket():  # containerd 2: where an NRI plugin connects
        click.echo(f"export GPUZOMBIE_NRI_SOCKET={shlex.quote(str(layout.nri_socket))}")


@command.command("kubectl", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kubectl_command(args: tuple[str, ...]) -> None:
    """Run the built kubectl against the cluster: gpuzombie cluster kubectl -- get pods -A."""
    layout = Layout.from_env()
    state = _state_or_fail(layout)
    argv = [str(layout.bin / "kubectl"), f"--kubeconfig={state.kubeconfig}", *args]
    try:
        sys.exit(subprocess.run(argv, check=False).returncode)
    except OSError as exc:
        raise GpuzombieError(f"cannot run kubectl: {exc.strerror}") from None
