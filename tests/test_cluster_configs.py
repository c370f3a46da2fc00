"""The single-node cluster's files as pure renderings of its layout, and its throwaway PKI, checked
with the cryptography library (tests/kube/test_cluster_node.py runs them on the real node)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="cryptography is in the 'cluster' extra")
pytest.importorskip(
    "grpc", reason="grpcio is in the 'node' extra (the cluster's images come from the lab's containerd)"
)

from cryptography import x509
from cryptography.x509.oid import NameOID

from gpuzombie.cluster import configs
from gpuzombie.cluster.build import CONTAINERD_COMMANDS, ContainerdSource, KubeSource
from gpuzombie.cluster.layout import DEFAULT_SHIM_SOCKET_DIR, NODE_NAME, Layout, Ports
from gpuzombie.cluster.node import _cert_requests, _cni_results
from gpuzombie.cluster.pki import make_pki

LAYOUT = Layout(Path("/var/lib/gpuzombie-cluster"))
REPO = Path(__file__).resolve().parents[1]


def test_every_process_names_the_cluster_directory_so_down_finds_it() -> None:
    for component in configs.components(LAYOUT, Ports()):
        assert any(str(LAYOUT.root) + "/" in arg for arg in component.argv), component.name


def test_every_listener_is_on_loopback_at_the_layouts_ports() -> None:
    ports = Ports()
    argv = {c.name: " ".join(c.argv) for c in configs.components(LAYOUT, ports)}
    assert f"--secure-port={ports.apiserver}" in argv["kube-apiserver"]
    assert f"--listen-client-urls=http://127.0.0.1:{ports.etcd_client}" in argv["etcd"]
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert "--bind-address=127.0.0.1" in argv[name]
    kubelet = json.loads(configs.kubelet_config(LAYOUT, ports))
    # the kubelet refuses a loopback node IP: it serves on the bridge's own address, made by up
    assert (kubelet["address"], kubelet["healthzBindAddress"], kubelet["readOnlyPort"]) == ("10.98.0.1", "127.0.0.1", 0)


def test_kubelet_config_carries_what_this_machine_needs() -> None:
    kubelet = json.loads(configs.kubelet_config(LAYOUT, Ports()))
    assert kubelet["failCgroupV1"] is False
    assert kubelet["cgroupRoot"] == "/gpuzombie-cluster0"
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{LAYOUT.containerd_socket}"
    assert kubelet["imageGCHighThresholdPercent"] == 100  # imported images must survive
    assert kubelet["podLogsDir"].startswith(str(LAYOUT.root))  # another instance's kubelet would clean it


def test_containerd_restricts_oom_score_adj_and_keeps_state_inside() -> None:
    text = configs.containerd_config(LAYOUT, cni_bin="/usr/lib/cni")
    assert "restrict_oom_score_adj = true" in text
    assert f'address = "{LAYOUT.containerd_socket}"' in text
    assert f'sandbox_image = "{configs.PAUSE_IMAGE}"' in text


def test_cni_bridge_is_ours_and_masquerades_nothing() -> None:
    network = json.loads(configs.cni_network(LAYOUT))
    bridge = network["plugins"][0]
    assert (bridge["bridge"], bridge["ipMasq"]) == ("gzcluster0", False)
    assert bridge["ipam"]["dataDir"].startswith(str(LAYOUT.root))


def test_kubeconfig_points_at_the_api_server_with_the_users_certificate() -> None:
    config = json.loads(configs.kubeconfig(LAYOUT, Ports(), "kubelet"))
    assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{Ports().apiserver}"
    assert config["users"][0]["user"]["client-certificate"] == str(LAYOUT.pki / "kubelet.pem")


def test_pki_gives_the_node_and_admin_their_kubernetes_identities(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", _cert_requests(LAYOUT))
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())

    def subject(stem: str) -> tuple[str, list[str]]:
        cert = x509.load_pem_x509_certificate(pki.cert(stem).read_bytes())
        cert.verify_directly_issued_by(ca)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        return str(cn), [str(o) for o in orgs]

    assert subject("kubelet") == (f"system:node:{NODE_NAME}", ["system:nodes"])
    assert subject("admin")[1] == ["system:masters"]
    apiserver = x509.load_pem_x509_certificate(pki.cert("apiserver").read_bytes())
    sans = apiserver.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert oct(pki.key("ca").stat().st_mode & 0o777) == "0o600"


def test_the_build_is_keyed_by_the_pinned_release_and_its_sums() -> None:
    source = KubeSource(REPO / "go" / "kube")
    assert source.kubernetes_version.startswith("v1.")
    key = source.cache_key("go1.26.8")
    assert key == source.cache_key("go1.26.8") != source.cache_key("go1.27.0")
    assert f"version.gitVersion={source.kubernetes_version}" in source.ldflags()


def _containerd2(layout: Layout = LAYOUT) -> dict:
    text = configs.containerd2_config(
        layout, cni_bin="/usr/lib/cni", shim=str(layout.bin / "containerd-shim-runc-v2"), runc="/usr/sbin/runc"
    )
    return tomllib.loads(text)


def test_containerd2_restricts_oom_score_adj_where_2x_reads_it() -> None:
    config = _containerd2()
    assert config["version"] == 4
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    # a RuntimeConfig field of the cri.v1.runtime plugin itself, not of its containerd table
    assert runtime["restrict_oom_score_adj"] is True
    assert "restrict_oom_score_adj" not in runtime["containerd"]
    assert "restrict_oom_score_adj" not in config["plugins"].get("io.containerd.grpc.v1.cri", {})
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_path"] == str(LAYOUT.bin / "containerd-shim-runc-v2")
    assert runc["options"]["BinaryName"] == "/usr/sbin/runc"
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == configs.PAUSE_IMAGE


def _runtimes(config: dict) -> dict:
    return config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]


def test_containerd2_gives_nvidias_runtime_a_handler_of_its_own_beside_runc() -> None:
    assert set(_runtimes(_containerd2())) == {"runc"}
    shim = str(LAYOUT.bin / "containerd-shim-runc-v2")
    text = configs.containerd2_config(
        LAYOUT,
        cni_bin="/usr/lib/cni",
        shim=shim,
        runc="/usr/sbin/runc",
        nvidia_runtime="/x/nvidia-container-runtime.cdi",
    )
    got = _runtimes(tomllib.loads(text))
    assert set(got) == {"runc", "nvidia"}
    assert got["nvidia"]["runtime_path"] == shim
    assert got["nvidia"]["options"] == {"BinaryName": "/x/nvidia-container-runtime.cdi", "Root": str(LAYOUT.runc_root)}
    assert "default_runtime_name" not in tomllib.loads(text)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]


def test_containerd2_listens_only_on_the_clusters_sockets() -> None:
    config = _containerd2()
    # version 4 ignores a top-level [grpc]: containerd would listen on /run/containerd/containerd.sock
    assert "grpc" not in config and "ttrpc" not in config
    servers = config["plugins"]
    assert servers["io.containerd.server.v1.grpc"]["address"] == str(LAYOUT.containerd_socket)
    assert servers["io.containerd.server.v1.ttrpc"]["address"] == f"{LAYOUT.containerd_socket}.ttrpc"


def test_containerd2_keeps_every_path_under_the_cluster_directory() -> None:
    config = _containerd2()
    plugins = config["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    paths = [
        config["root"],
        config["state"],
        runtime["cni"]["conf_dir"],
        *runtime["cdi_spec_dirs"],
        runtime["containerd"]["runtimes"]["runc"]["options"]["Root"],
        *(plugins["io.containerd.nri.v1.nri"][k] for k in ("socket_path", "plugin_path", "plugin_config_path")),
        plugins["io.containerd.shim.v1.manager"]["socket_dir"],
    ]
    assert all(p.startswith(str(LAYOUT.root) + "/") for p in paths), paths
    assert runtime["netns_mounts_under_state_dir"] is True
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is False
    assert "io.containerd.internal.v1.opt" in config["disabled_plugins"]  # it would make /opt/containerd


def test_containerd2_bounds_what_a_dead_nri_plugin_costs() -> None:
    nri = _containerd2()["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["plugin_request_timeout"] == configs.NRI_REQUEST_TIMEOUT == "2s"
    assert nri["plugin_registration_timeout"] == configs.NRI_REGISTRATION_TIMEOUT == "5s"


def test_shim_sockets_stay_inside_unless_the_path_is_too_long_for_containerd() -> None:
    assert LAYOUT.shim_socket_dir == "/var/lib/gpuzombie-cluster/s"
    long = Layout(Path("/var/lib/gpuzombie-cluster-with-a-long-name"))
    assert long.shim_socket_dir == DEFAULT_SHIM_SOCKET_DIR  # 42 characters at most (2.4.2)


def test_the_runtime_comes_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUZOMBIE_CLUSTER_RUNTIME", raising=False)
    assert Layout.from_env().runtime == "containerd"
    monkeypatch.setenv("GPUZOMBIE_CLUSTER_RUNTIME", "containerd2")
    assert Layout.from_env().runtime == "containerd2"
    monkeypatch.setenv("GPUZOMBIE_CLUSTER_RUNTIME", "crio")
    with pytest.raises(ValueError, match="containerd2"):
        Layout.from_env()


def test_the_containerd2_build_is_keyed_and_stamped_with_its_release() -> None:
    source = ContainerdSource(REPO / "go" / "containerd")
    assert source.version.startswith("v2.")
    assert source.cache_key("go1.26.8") == source.cache_key("go1.26.8") != source.cache_key("go1.27.0")
    assert f"github.com/containerd/containerd/v2/version.Version={source.version}" in source.ldflags()
    go_mod = (REPO / "go" / "containerd" / "go.mod").read_text()
    assert all(f"containerd/v2/cmd/{c}" in go_mod for c in CONTAINERD_COMMANDS)  # the tool directive


def test_down_finds_the_cni_cache_files_of_its_own_sandboxes_only(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cluster")
    ours, theirs = "a" * 64, "b" * 64
    (layout.containerd / "root" / "io.containerd.grpc.v1.cri" / "sandboxes" / ours).mkdir(parents=True)
    cache = tmp_path / "results"
    cache.mkdir()
    names = [f"gpuzombie-cluster0-{ours}-eth0", f"cni-loopback-{ours}-lo", f"gpuzombie-cluster1-{theirs}-eth0"]
    for name in names:
        (cache / name).touch()
    assert sorted(_cni_results(layout, cache)) == sorted(str(cache / n) for n in names[:2])
