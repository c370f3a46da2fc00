"""Where the single-node cluster keeps everything, and the ports it takes: one directory, so that
``cluster down`` (and the lab's leftover sweep it reuses) finds every process by a path in its
command line, every mount under it, and removes it whole."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLUSTER_DIR_ENV = "GPUZOMBIE_CLUSTER_DIR"
INSTANCE_ENV = "GPUZOMBIE_CLUSTER_INSTANCE"
"""0-9: a second cluster beside the first (the fault tests) takes ports 100 higher, its own bridge
and pod subnet."""
RUNTIME_ENV = "GPUZOMBIE_CLUSTER_RUNTIME"
"""The node's container runtime: ``containerd`` (Debian's 1.6, the default) or ``containerd2``
(2.4.2 built from go/containerd)."""
RUNTIMES = ("containerd", "containerd2")
NVIDIA_RUNTIME_ENV = "GPUZOMBIE_NVIDIA_RUNTIME"
"""containerd2 only: the path of NVIDIA's ``nvidia-container-runtime`` (or its ``.cdi`` form), made
the runtime handler ``nvidia`` beside runc, as the GPU Operator's toolkit does; a RuntimeClass
``nvidia`` then names it (scripts/device/kube_gpu.sh). Unset: runc only."""
SHIM_SOCKET_DIR_MAX = 42
"""containerd 2.x refuses a longer shim ``socket_dir`` (core/runtime/v2/socket_linux.go): a unix
socket path, the dir plus a 64-hex name, must fit in 108 bytes."""
DEFAULT_SHIM_SOCKET_DIR = "/run/containerd/s"
DEFAULT_CLUSTER_DIR = Path("/var/lib/gpuzombie-cluster")
NODE_NAME = "gpuzombie-node"
SERVICE_CIDR = "10.97.0.0/16"


@dataclass(frozen=True)
class Ports:
    """Every TCP port the cluster listens on, all on 127.0.0.1; ``up`` refuses if one is taken."""

    etcd_client: int = 12379
    etcd_peer: int = 12380
    apiserver: int = 16443
    controller_manager: int = 10257
    scheduler: int = 10259
    kubelet: int = 10250
    kubelet_healthz: int = 10248

    def all(self) -> dict[str, int]:
        return dict(vars(self))

    @classmethod
    def for_instance(cls, instance: int) -> Ports:
        return cls(**{name: port + 100 * instance for name, port in cls().all().items()})


@dataclass(frozen=True)
class Layout:
    """The cluster's directory tree under ``root``."""

    root: Path
    instance: int = 0
    runtime: str = "containerd"

    @classmethod
    def from_env(cls) -> Layout:
        instance = os.environ.get(INSTANCE_ENV, "0")
        if not (instance.isdigit() and int(instance) < 10):
            raise ValueError(f"{INSTANCE_ENV} must be 0-9, not {instance!r}")
        runtime = os.environ.get(RUNTIME_ENV) or "containerd"
        if runtime not in RUNTIMES:
            raise ValueError(f"{RUNTIME_ENV} must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
        return cls(Path(os.environ.get(CLUSTER_DIR_ENV) or DEFAULT_CLUSTER_DIR), int(instance), runtime)

    @property
    def ports(self) -> Ports:
        return Ports.for_instance(self.instance)

    @property
    def bridge(self) -> str:
        """The CNI bridge on the host: its own name, so that ``down`` deletes only what ``up`` made."""
        return f"gzcluster{self.instance}"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``: its pods live under /gpuzombie-cluster<N>/kubepods, apart from
        the lab's private containerd pods under /kubepods (and another instance's), which a kubelet
        would otherwise call orphaned and kill."""
        return f"/gpuzombie-cluster{self.instance}"

    @property
    def pod_subnet(self) -> str:
        return f"10.98.{self.instance}.0/24"

    @property
    def node_ip(self) -> str:
        """The bridge's own address, made by ``up`` before the kubelet starts: the kubelet refuses a
        loopback node IP, and the API server reaches the kubelet (logs, exec) here."""
        return f"10.98.{self.instance}.1"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def shim_socket_dir(self) -> str:
        """Where containerd 2's shims put their sockets: ``<root>/s`` when the path is short enough
        for its limit, else containerd's own default (shared, as 1.6's always is; ``down`` then
        removes this cluster's sockets there by name)."""
        inside = str(self.root / "s")
        return inside if len(inside) <= SHIM_SOCKET_DIR_MAX else DEFAULT_SHIM_SOCKET_DIR

    @property
    def runc_root(self) -> Path:
        """runc's state (containerd 2): under the cluster, not the shared /run/containerd/runc."""
        return self.containerd / "runc"

    @property
    def nri(self) -> Path:
        """containerd 2's NRI socket, plugins and their configs: inside, not /var/run/nri, /opt/nri."""
        return self.containerd / "nri"

    @property
    def nri_socket(self) -> Path:
        return self.nri / "nri.sock"

    @property
    def cdi_specs(self) -> Path:
        """containerd 2's CDI spec directory: inside, not /etc/cdi and /var/run/cdi."""
        return self.root / "cdi"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "conf"

    @property
    def cni_state(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def bin(self) -> Path:
        """The multi-call binary's links (kube-apiserver, kubelet, ...), each named as its component."""
        return self.root / "bin"

    def kubeconfig(self, user: str) -> Path:
        return self.root / f"{user}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("admin")
