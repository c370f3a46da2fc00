"""``cluster up``, ``down`` and ``status``: the single node's processes, started in order, each
waited for until it answers, recorded by pid and start time in ``state.json``; and their removal,
which also works from nothing but the directory (after a SIGKILL of whatever ``up`` left running)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuzombie.cluster import configs
from gpuzombie.cluster.build import COMPONENTS, CONTAINERD_COMMANDS, Progress, ensure_binary, ensure_containerd
from gpuzombie.cluster.layout import NODE_NAME, NVIDIA_RUNTIME_ENV, SERVICE_CIDR, Layout, Ports
from gpuzombie.cluster.pki import CertRequest, make_pki
from gpuzombie.errors import GpuzombieError
from gpuzombie.lab.runtime.containerd import ImageSpec, busybox_image, cni_bin_dir, pause_image, write_image_archive
from gpuzombie.lab.runtime.rundirs import cgroup_roots, record_cgroup, remove_run, shim_sockets, unmount
from gpuzombie.proc.own import mount_points_under
from gpuzombie.proc.pidfd import read_start_and_state

START_TIMEOUT_S = 120.0
"""Per component, beside load: the API server's first start (its storage and RBAC bootstrap) took
8-20 s here; the node's first Ready 10-25 s."""
CNI_PLUGINS = ("bridge", "host-local", "loopback")
KUBELET_IPTABLES_CHAINS = (("mangle", "KUBE-IPTABLES-HINT"), ("filter", "KUBE-FIREWALL"))
KUBELET_CANARY = "KUBE-KUBELET-CANARY"
CNI_CACHE = Path("/var/lib/cni/results")
"""libcni's cache of each ADD's result, ``<network>-<sandbox id>-<interface>``: fixed (containerd
sets no cache dir), removed by a DEL, which a killed kubelet never sends."""
HOST_BINARIES = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip")
CONTAINERD2_HOST_BINARIES = ("runc", "ip")
"""containerd 2 is built (go/containerd); runc stays Debian's (1.1.5: docs/kubernetes.md)."""


class ClusterError(GpuzombieError):
    """The cluster could not start, or a part of it could not be removed; one line that names which."""


@dataclass(frozen=True)
class Started:
    name: str
    pid: int
    start_ticks: int


@dataclass
class ClusterState:
    """What ``up`` wrote: read by ``status``, ``down`` and ``env``."""

    root: str
    kubeconfig: str
    kubernetes_version: str
    containerd_version: str
    binary: str
    ports: dict[str, int]
    processes: list[Started] = field(default_factory=list)
    iptables_chains_made: list[list[str]] = field(default_factory=list)
    started_at: float = 0.0
    ready_s: float = 0.0
    runtime: str = "containerd"

    def write(self, path: Path) -> None:
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=2) + "\n")
        partial.rename(path)

    @classmethod
    def read(cls, path: Path) -> ClusterState | None:
        try:
            data = json.loads(path.read_text())
            data["processes"] = [Started(**p) for p in data.get("processes", [])]
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def alive(process: Started) -> bool:
    now = read_start_and_state("/proc", process.pid)
    return now is not None and now[0] == process.start_ticks and now[1] not in ("Z", "X")


# --- the checks `up` makes before it starts anything ----------------------------------------------


def preflight(layout: Layout, ports: Ports) -> None:
    """Refuse, in one line and before anything starts: not root, a cluster already up, a port taken,
    a host binary or CNI plugin missing."""
    if os.geteuid() != 0:
        raise ClusterError("cluster up needs root (it runs a kubelet, containerd and mounts)")
    state = ClusterState.read(layout.state_file)
    if state and any(alive(p) for p in state.processes):
        raise ClusterError(f"a cluster is already up ({layout.root}); gpuzombie cluster down stops it")
    for name, port in ports.all().items():
        with socket.socket() as probe:
            # as Go's listeners do: a TIME_WAIT left by an earlier run is no owner, a listener is
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((configs.LOOPBACK, port))
            except OSError:
                raise ClusterError(f"port {port} ({name.replace('_', ' ')}) is taken on {configs.LOOPBACK}") from None
    missing = [b for b in host_binaries(layout) if not shutil.which(b)]
    if missing:
        raise ClusterError(f"missing {', '.join(missing)} (make debian installs containerd, runc and iproute2)")
    if not cni_plugins_dir():
        raise ClusterError(
            f"no CNI plugins {', '.join(CNI_PLUGINS)} (Debian: apt-get install containernetworking-plugins)"
        )
    for image in (pause_image, busybox_image):
        image()  # raises a one-line error naming the missing package (catatonit, busybox-static)


def host_binaries(layout: Layout) -> tuple[str, ...]:
    return CONTAINERD2_HOST_BINARIES if layout.runtime == "containerd2" else HOST_BINARIES


def runtime_binary(layout: Layout, name: str) -> str:
    """containerd, ctr: containerd 2's own, linked into the cluster's bin/ by ``up``; else Debian's."""
    link = layout.bin / name
    return str(link) if link.exists() else name


def cni_plugins_dir() -> str | None:
    base = cni_bin_dir()
    candidates = [base] if base else []
    candidates += ["/usr/lib/cni", "/opt/cni/bin"]
    return next((d for d in candidates if all(os.path.isfile(os.path.join(d, p)) for p in CNI_PLUGINS)), None)


# --- waiting for a component to answer --------------------------------------------------------------


def _https_ok(url: str, cert: tuple[Path, Path] | None = None, ca: Path | None = None) -> bool:
    context = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    try:
        with urllib.request.urlopen(url, context=context, timeout=3) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


class Node:
    """The single node being started: its layout, ports, binary, and the processes started so far."""

    def __init__(self, layout: Layout, ports: Ports, progress: Progress) -> None:
        self.layout, self.ports, self.progress = layout, ports, progress
        self.started: list[Started] = []

    def _log_tail(self, name: str, lines: int = 3) -> str:
        try:
            text = (self.layout.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(" ".join(line.split())[:240] for line in text.strip().splitlines()[-lines:])

    def start(self, name: str, argv: Sequence[str], env: Sequence[tuple[str, str]] = ()) -> Started:
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        with open(self.layout.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, **dict(env)),
                start_new_session=True,  # a Ctrl-C to `up` must not kill the cluster it leaves running
            )
        ticks = read_start_and_state("/proc", process.pid)
        started = Started(name, process.pid, ticks[0] if ticks else 0)
        self.started.append(started)
        return started

    def wait(self, name: str, ready: Callable[[], bool], timeout: float = START_TIMEOUT_S) -> None:
        """Until ``ready()``; a ClusterError naming the component that exited or never answered."""
        began = time.monotonic()
        while not ready():
            for process in self.started:
                if not alive(process):
                    raise ClusterError(f"{process.name} exited while starting: {self._log_tail(process.name)}")
            if time.monotonic() - began > timeout:
                raise ClusterError(f"{name} did not answer within {timeout:.0f} s: {self._log_tail(name)}")
            time.sleep(0.25)
        self.progress(f"{name} ready in {time.monotonic() - began:.1f} s")

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [str(self.layout.bin / "kubectl"), f"--kubeconfig={self.layout.admin_kubeconfig}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _cert_requests(layout: Layout) -> list[CertRequest]:
    service_ip = SERVICE_CIDR.split("/")[0].rsplit(".", 1)[0] + ".1"
    api_names = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
    return [
        CertRequest(
            "apiserver",
            "kube-apiserver",
            dns_names=(*api_names, "localhost"),
            ip_addresses=(configs.LOOPBACK, service_ip),
            server=True,
        ),
        CertRequest("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",), client=True),
        CertRequest("admin", "gpuzombie-admin", ("system:masters",), client=True),
        CertRequest("controller-manager", "system:kube-controller-manager", client=True),
        CertRequest("scheduler", "system:kube-scheduler", client=True),
        CertRequest("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",), client=True),
        CertRequest(
            "kubelet-serving", NODE_NAME, dns_names=(NODE_NAME,), ip_addresses=(configs.LOOPBACK,), server=True
        ),
    ]


def _write_files(layout: Layout, ports: Ports, binary: Path, cni_bin: str, containerd2: Path | None = None) -> None:
    for d in (
        layout.root,
        layout.bin,
        layout.containerd,
        layout.cni_conf,
        layout.cni_state,
        layout.logs,
        layout.kubelet_root,
    ):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    links = dict.fromkeys(COMPONENTS, binary)
    if containerd2:
        links.update({name: containerd2 / name for name in CONTAINERD_COMMANDS})
    for name, target in links.items():
        link = layout.bin / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    make_pki(layout.pki, _cert_requests(layout))
    for user in ("admin", "controller-manager", "scheduler", "kubelet"):
        layout.kubeconfig(user).write_text(configs.kubeconfig(layout, ports, user))
    (layout.root / "kubelet.json").write_text(configs.kubelet_config(layout, ports))
    if containerd2:
        for d in (layout.nri / "plugins", layout.nri / "conf.d", layout.cdi_specs, layout.runc_root):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        runc = shutil.which("runc") or "runc"
        shim = str(layout.bin / "containerd-shim-runc-v2")
        nvidia = os.environ.get(NVIDIA_RUNTIME_ENV) or None
        text = configs.containerd2_config(layout, cni_bin=cni_bin, shim=shim, runc=runc, nvidia_runtime=nvidia)
    else:
        text = configs.containerd_config(layout, cni_bin=cni_bin)
    (layout.containerd / "config.toml").write_text(text)
    (layout.cni_conf / "10-gpuzombie-cluster.conflist").write_text(configs.cni_network(layout))


def _make_bridge(layout: Layout) -> None:
    """The CNI bridge with the node's address on it, before the kubelet (the bridge plugin then
    finds it and keeps it)."""
    prefix = layout.pod_subnet.split("/")[1]
    for argv in (
        ["ip", "link", "add", layout.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{layout.node_ip}/{prefix}", "dev", layout.bridge],
        ["ip", "link", "set", layout.bridge, "up"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise ClusterError(f"cannot make the bridge {layout.bridge}: {' '.join(argv[1:4])}: {done.stderr.strip()}")


def _iptables_chains() -> set[tuple[str, str, str]]:
    """(tool, table, chain) of the kubelet's chains that exist now."""
    found = set()
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(tool):
            continue
        for table in ("mangle", "nat", "filter"):
            done = subprocess.run(
                [tool, "-w", "5", "-t", table, "-S"], capture_output=True, text=True, timeout=30, check=False
            )
            for line in done.stdout.splitlines():
                parts = line.split()
                if (
                    len(parts) >= 2
                    and parts[0] == "-N"
                    and parts[1] in (KUBELET_CANARY, *(c for _, c in KUBELET_IPTABLES_CHAINS))
                ):
                    found.add((tool, table, parts[1]))
    return found


def import_archive(layout: Layout, name: str, archive: Path) -> None:
    """Import a docker-archive into the node's containerd, where the kubelet finds it (no pull)."""
    argv = [
        runtime_binary(layout, "ctr"),
        "--address",
        str(layout.containerd_socket),
        "--namespace",
        "k8s.io",
        "images",
        "import",
        str(archive),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise ClusterError(f"cannot import image {name}: {' '.join(done.stderr.split())[-300:]}")


def import_images(layout: Layout, images: Sequence[ImageSpec]) -> None:
    archives = layout.root / "images"
    archives.mkdir(exist_ok=True)
    for spec in images:
        path = archives / (spec.name.replace("/", "_").replace(":", "_") + ".tar")
        write_image_archive(spec, path)
        import_archive(layout, spec.name, path)


def containerd_version(layout: Layout) -> str:
    argv = [runtime_binary(layout, "containerd"), "--version"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    parts = done.stdout.split()
    return parts[2] if len(parts) >= 3 else "unknown"


def up(layout: Layout, ports: Ports, progress: Progress, images: Sequence[ImageSpec] = ()) -> ClusterState:
    """Start the node and return once it is Ready and its default ServiceAccount exists; on any
    failure everything started is removed again and a ClusterError names the component."""
    preflight(layout, ports)
    if layout.root.exists():
        down(layout)  # what a SIGKILLed cluster left: nothing of it is alive (preflight checked)
    binary = ensure_binary(progress)
    containerd2 = ensure_containerd(progress) if layout.runtime == "containerd2" else None
    cni_bin = cni_plugins_dir()
    assert cni_bin is not None
    began = time.monotonic()
    chains_before = _iptables_chains()
    node = Node(layout, ports, progress)
    try:
        _write_files(layout, ports, binary, cni_bin, containerd2)
        record_cgroup(layout.root, layout.cgroup_root)  # before it is made: a crash still finds it
        _make_bridge(layout)
        for hierarchy in cgroup_roots():  # the kubelet wants its cgroupRoot in every hierarchy
            os.makedirs(hierarchy + layout.cgroup_root, exist_ok=True)
        state = ClusterState(
            root=str(layout.root),
            kubeconfig=str(layout.admin_kubeconfig),
            kubernetes_version=_binary_version(layout),
            containerd_version=containerd_version(layout),
            binary=str(binary),
            ports=ports.all(),
            started_at=time.time(),
            runtime=layout.runtime,
        )
        containerd = runtime_binary(layout, "containerd")
        node.start("containerd", [containerd, "--config", str(layout.containerd / "config.toml")])
        ctr = [runtime_binary(layout, "ctr"), "--address", str(layout.containerd_socket), "version"]
        node.wait(
            "containerd", lambda: subprocess.run(ctr, capture_output=True, timeout=10, check=False).returncode == 0
        )
        import_images(layout, [pause_image(configs.PAUSE_IMAGE), busybox_image(), *images])
        pki = layout.pki
        admin = (pki / "admin.pem", pki / "admin.key")
        probes: dict[str, Callable[[], bool]] = {
            "etcd": lambda: _http_ok(f"http://{configs.LOOPBACK}:{ports.etcd_client}/health"),
            "kube-apiserver": lambda: _https_ok(
                f"https://{configs.LOOPBACK}:{ports.apiserver}/readyz", admin, pki / "ca.pem"
            ),
            "kube-controller-manager": lambda: _https_ok(
                f"https://{configs.LOOPBACK}:{ports.controller_manager}/healthz"
            ),
            "kube-scheduler": lambda: _https_ok(f"https://{configs.LOOPBACK}:{ports.scheduler}/healthz"),
            "kubelet": lambda: _http_ok(f"http://{configs.LOOPBACK}:{ports.kubelet_healthz}/healthz"),
        }
        for component in configs.components(layout, ports):
            node.start(component.name, component.argv, component.env)
            state.processes = list(node.started)
            state.write(layout.state_file)
            node.wait(component.name, probes[component.name])
        node.wait("node Ready", lambda: _node_ready(node))
        node.wait("default ServiceAccount", lambda: node.kubectl("get", "serviceaccount", "default").returncode == 0)
        state.iptables_chains_made = [list(c) for c in sorted(_iptables_chains() - chains_before)]
        state.ready_s = round(time.monotonic() - began, 2)
        state.write(layout.state_file)
        return state
    except BaseException:
        problems = down(layout)
        if problems:
            progress("cleanup: " + "; ".join(problems))
        raise


def _node_ready(node: Node) -> bool:
    done = node.kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
    return done.returncode == 0 and done.stdout.strip() == "True"


def _binary_version(layout: Layout) -> str:
    done = subprocess.run(
        [str(layout.bin / "kubectl"), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    with contextlib.suppress(ValueError, KeyError):
        return str(json.loads(done.stdout)["clientVersion"]["gitVersion"])
    return "unknown"


def down(layout: Layout) -> list[str]:
    """Remove every trace of the cluster at ``layout``: its processes (by the paths in their command
    lines, and their descendants), mounts, cgroups, shim sockets, CNI cache files, bridge, the
    kubelet's iptables chains that it made, and the directory. Works with or without ``state.json``
    and for either runtime; what could not be removed, one line each."""
    if not layout.root.exists():
        return []
    state = ClusterState.read(layout.state_file)
    shims = shim_sockets(layout.containerd)
    cni_results = _cni_results(layout)
    problems = remove_run(layout.root)
    try:  # the kubelet's bind mount of its root dir onto itself, which remove_run cannot see
        leftover_mounts = mount_points_under(str(layout.root))
    except OSError as exc:
        leftover_mounts, problems = [], [*problems, f"cannot read this process's mountinfo: {exc.strerror}"]
    if leftover_mounts:
        unmount(leftover_mounts)
        problems = remove_run(layout.root)  # the directory again, now that nothing is mounted in it
    for path in [*shims, *cni_results]:
        with contextlib.suppress(OSError):
            os.unlink(path)
    subprocess.run(["ip", "link", "delete", layout.bridge], capture_output=True, timeout=30, check=False)
    chains = [tuple(c) for c in state.iptables_chains_made] if state else sorted(_iptables_chains())
    problems += _remove_iptables_chains(chains)
    return problems


def _cni_results(layout: Layout, cache: Path = CNI_CACHE) -> list[str]:
    """The CNI cache files of this cluster's pod sandboxes (by the ids its containerd keeps)."""
    try:
        ids = os.listdir(layout.containerd / "root" / "io.containerd.grpc.v1.cri" / "sandboxes")
        names = os.listdir(cache)
    except OSError:
        return []
    return [str(cache / n) for n in names for i in ids if len(i) == 64 and f"-{i}-" in n]


def _remove_iptables_chains(chains: Sequence[Sequence[str]]) -> list[str]:
    problems = []
    for tool, table, chain in chains:
        listed = subprocess.run(
            [tool, "-w", "5", "-t", table, "-S"], capture_output=True, text=True, timeout=30, check=False
        )
        for line in listed.stdout.splitlines():  # the jumps into it first
            parts = line.split()
            if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] == chain and parts[1] != chain:
                subprocess.run(
                    [tool, "-w", "5", "-t", table, "-D", *parts[1:]], capture_output=True, timeout=30, check=False
                )
        subprocess.run([tool, "-w", "5", "-t", table, "-F", chain], capture_output=True, timeout=30, check=False)
        done = subprocess.run(
            [tool, "-w", "5", "-t", table, "-X", chain], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0 and "No chain" not in done.stderr and "does not exist" not in done.stderr:
            problems.append(f"cannot remove {tool} chain {table}/{chain}: {done.stderr.strip()[-160:]}")
    return problems


@dataclass(frozen=True)
class Status:
    up: bool
    root: str
    kubeconfig: str | None
    kubernetes_version: str | None
    containerd_version: str | None
    processes: dict[str, bool]
    pod_resources_socket: str
    cri_socket: str


def status(layout: Layout) -> Status:
    state = ClusterState.read(layout.state_file)
    processes = {p.name: alive(p) for p in state.processes} if state else {}
    return Status(
        up=bool(processes) and all(processes.values()),
        root=str(layout.root),
        kubeconfig=state.kubeconfig if state else None,
        kubernetes_version=state.kubernetes_version if state else None,
        containerd_version=state.containerd_version if state else None,
        processes=processes,
        pod_resources_socket=str(layout.pod_resources_socket),
        cri_socket=str(layout.containerd_socket),
    )
