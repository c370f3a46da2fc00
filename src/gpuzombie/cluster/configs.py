"""The files each component reads, rendered as pure functions of the layout (tested on their text):
kubeconfigs, the kubelet's configuration, containerd's, the CNI network and the argv of each
component. Only what differs from the upstream defaults is set, each with the reason beside it
(docs/kubernetes.md lists them)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuzombie.cluster.layout import NODE_NAME, SERVICE_CIDR, Layout, Ports

LOOPBACK = "127.0.0.1"
PAUSE_IMAGE = "localhost/gpuzombie/pause:catatonit"
NRI_REGISTRATION_TIMEOUT = "5s"
NRI_REQUEST_TIMEOUT = "2s"
"""containerd's own defaults, written out: what a hung NRI plugin may cost one container start."""


@dataclass(frozen=True)
class Component:
    """One process of the cluster: its name, the multi-call binary's component and argv."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, layout: Layout, name: str, *flags: str, env: tuple[tuple[str, str], ...] = ()) -> Component:
        """The cluster's binary ``name`` (under ``layout.bin``) run with ``flags``."""
        return cls(name, (str(layout.bin / name), *flags), env)


def kubeconfig(layout: Layout, ports: Ports, user: str) -> str:
    """A kubeconfig for ``user`` (client certificate ``<user>.pem``) against the API server."""
    pki = layout.pki
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuzombie",
                "cluster": {
                    "server": f"https://{LOOPBACK}:{ports.apiserver}",
                    "certificate-authority": str(pki / "ca.pem"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(pki / f"{user}.pem"), "client-key": str(pki / f"{user}.key")},
            }
        ],
        "contexts": [{"name": "gpuzombie", "context": {"cluster": "gpuzombie", "user": user}}],
        "current-context": "gpuzombie",
    }
    return json.dumps(config, indent=2) + "\n"


def kubelet_config(layout: Layout, ports: Ports) -> str:
    """KubeletConfiguration (JSON is YAML): the settings this machine needs, nothing else."""
    pki = layout.pki
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # these machines are hybrid (v1 controllers); 1.35+ refuses v1 otherwise
        "cgroupDriver": "cgroupfs",  # no systemd here; containerd 1.6 cannot tell the kubelet (no RuntimeConfig)
        "cgroupRoot": layout.cgroup_root,  # apart from the lab's /kubepods pods, which the kubelet would kill as orphans
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        # Not /var/log/pods, which every kubelet on the machine shares: another instance's kubelet
        # removes the log directories of pods it does not know (kubectl logs: "no such file").
        "podLogsDir": str(layout.root / "pod-logs"),
        "address": layout.node_ip,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": LOOPBACK,
        "healthzPort": ports.kubelet_healthz,
        "tlsCertFile": str(pki / "kubelet-serving.pem"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.pem")},
        },
        "authorization": {"mode": "Webhook"},
        "oomScoreAdj": 0,  # -999 needs CAP_SYS_RESOURCE, which these sandboxes lack
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        # Images are imported, never pulled: garbage collection must not remove them, and a nearly
        # full disk of a shared machine must not evict the test pods.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "nodeStatusUpdateFrequency": "5s",  # Ready sooner after start
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "maxPods": 110,
    }
    return json.dumps(config, indent=2) + "\n"


def containerd_config(layout: Layout, *, cni_bin: str) -> str:
    """containerd 1.6's config (version 2): everything under the cluster's directory."""
    d = layout.containerd
    return f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{layout.containerd_socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{layout.cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


def containerd2_config(layout: Layout, *, cni_bin: str, shim: str, runc: str, nvidia_runtime: str | None = None) -> str:
    """containerd 2's config, everything under the cluster's directory: root, state, socket, the
    shims' sockets (when short enough), runc's state, NRI's socket and plugin directories, the CDI
    specs. Version 4, 2.4's own: the CRI plugins laid out as in version 3 (2.0), the servers
    (grpc, ttrpc) as plugins since 2.3; an older version is migrated at every start.
    ``nvidia_runtime``: NVIDIA's container runtime as the handler ``nvidia`` (runc stays the
    default), with runc's state, as the GPU Operator configures a node."""
    d = layout.containerd
    runtime = "plugins.'io.containerd.cri.v1.runtime'"

    def handler(name: str, binary: str) -> str:
        """A runtime handler on the built shim, running ``binary`` with runc's state directory."""
        return f"""  [{runtime}.containerd.runtimes.{name}]
    runtime_type = "io.containerd.runc.v2"
    runtime_path = "{shim}"
    [{runtime}.containerd.runtimes.{name}.options]
      BinaryName = "{binary}"
      Root = "{layout.runc_root}"
"""

    handlers = handler("runc", runc) + (handler("nvidia", nvidia_runtime) if nvidia_runtime is not None else "")
    return f"""version = 4
root = "{d}/root"
state = "{d}/state"
# opt would make /opt/containerd; no traces are exported
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
# Version 4 ignores a top-level [grpc] (it would listen on /run/containerd/containerd.sock), and no
# longer derives the ttrpc socket from it: each server is a plugin with its own address.
[plugins.'io.containerd.server.v1.grpc']
  address = "{layout.containerd_socket}"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{layout.containerd_socket}.ttrpc"
[{runtime}]
  # 2.x moved it from the grpc.v1.cri plugin here (internal/cri/config RuntimeConfig): no
  # CAP_SYS_RESOURCE, so the pause container keeps containerd's own score instead of -998
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{layout.cdi_specs}"]
  [{runtime}.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{layout.cni_conf}"
{handlers}[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "{layout.nri_socket}"
  plugin_path = "{layout.nri / "plugins"}"
  plugin_config_path = "{layout.nri / "conf.d"}"
  # A plugin that does not answer delays a container's start by at most the request timeout, once:
  # containerd (NRI 0.12.3) then drops it and starts the container without it (docs/admission.md).
  plugin_registration_timeout = "{NRI_REGISTRATION_TIMEOUT}"
  plugin_request_timeout = "{NRI_REQUEST_TIMEOUT}"
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "{layout.shim_socket_dir}"
"""


def cni_network(layout: Layout) -> str:
    """A bridge network of its own (gzcluster0), host-local addresses kept under the cluster's
    directory, no masquerade (no iptables rule to leave behind): pods reach each other and the host,
    the host (the API server, Prometheus) reaches them."""
    config = {
        "cniVersion": "1.0.0",
        "name": f"gpuzombie-cluster{layout.instance}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": layout.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": layout.pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.cni_state),
                },
            }
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def _etcd(layout: Layout, ports: Ports) -> Component:
    return Component.of(
        layout,
        "etcd",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls=http://{LOOPBACK}:{ports.etcd_client}",
        f"--advertise-client-urls=http://{LOOPBACK}:{ports.etcd_client}",
        f"--listen-peer-urls=http://{LOOPBACK}:{ports.etcd_peer}",
        f"--initial-advertise-peer-urls=http://{LOOPBACK}:{ports.etcd_peer}",
        f"--initial-cluster=default=http://{LOOPBACK}:{ports.etcd_peer}",
        "--unsafe-no-fsync",  # a throwaway cluster: fsync on a shared disk only slows the tests
        "--quota-backend-bytes=1073741824",
    )


def _apiserver(layout: Layout, ports: Ports) -> Component:
    pki = layout.pki
    return Component.of(
        layout,
        "kube-apiserver",
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.pem'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.pem'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.pem'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere here
        "--allow-privileged=true",  # the node agent's DaemonSet is privileged (hostPID)
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        # No kube-proxy: the API server dials a webhook Service's endpoints (the pod) itself.
        "--enable-aggregator-routing=true",
        # It listens on loopback only, which the endpoint reconciler refuses to publish: the
        # `kubernetes` Service gets no endpoints (pods do not call the API server here).
        "--endpoint-reconciler-type=none",
        "--profiling=false",
    )


def _controller(layout: Layout, name: str, port: int, *flags: str) -> Component:
    """A control-plane controller (the controller manager, the scheduler): its kubeconfig for the API
    server and for delegated authentication and authorization, loopback, its own certificates; one
    replica (no leader election), no profiling."""
    kubeconfig = layout.kubeconfig(name)
    return Component.of(
        layout,
        f"kube-{name}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--cert-dir={layout.pki / name}",
        *flags,
        "--leader-elect=false",
        "--profiling=false",
    )


def _controller_manager(layout: Layout, ports: Ports) -> Component:
    pki = layout.pki
    return _controller(
        layout,
        "controller-manager",
        ports.controller_manager,
        f"--root-ca-file={pki / 'ca.pem'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--cluster-signing-cert-file={pki / 'ca.pem'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    )


def _scheduler(layout: Layout, ports: Ports) -> Component:
    return _controller(layout, "scheduler", ports.scheduler)


def _kubelet(layout: Layout, ports: Ports) -> Component:
    return Component.of(
        layout,
        "kubelet",
        f"--config={layout.root / 'kubelet.json'}",
        f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.pki / 'kubelet'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={layout.node_ip}",
        # cAdvisor reads container stats from the node's containerd (go/kube/main.go: no kubelet flag).
        env=(("KUBE_CADVISOR_CONTAINERD_ENDPOINT", str(layout.containerd_socket)),),
    )


def components(layout: Layout, ports: Ports) -> list[Component]:
    """The processes in start order, each named so that ``cluster status`` and errors can say which."""
    return [make(layout, ports) for make in (_etcd, _apiserver, _controller_manager, _scheduler, _kubelet)]
