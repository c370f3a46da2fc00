"""The cgroup parser on fixture lines: every runtime × driver × cgroup version × QoS, and negatives.

Layouts follow what kubelet's cgroup managers, containerd, CRI-O, docker and podman write (their
public test suites and docs show the same shapes); a few lines are verbatim from public test
fixtures and from this machine (MACHINE-FACTS.md).
"""

from __future__ import annotations

import itertools

import pytest

from gpuzombie.k8s.cgroup import cgroup_version, parse_cgroup_lines, parse_cgroup_path

CID = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"
UID = "74c13223-5a00-11e9-b385-42010a80018d"
V1_CONTROLLERS = ("cpu,cpuacct", "memory", "devices", "pids", "name=systemd")


def kube_path(runtime: str, driver: str, qos: str) -> str:
    """The container cgroup path kubelet + the runtime create for a pod of ``qos``."""
    if driver == "systemd":
        u = UID.replace("-", "_")
        if qos == "guaranteed":
            pod = f"/kubepods.slice/kubepods-pod{u}.slice"
        else:
            pod = f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice"
        leaf = {
            "containerd": f"cri-containerd-{CID}.scope",
            "cri-o": f"crio-{CID}.scope",
            "docker": f"docker-{CID}.scope",
        }[runtime]
    else:
        pod = f"/kubepods/pod{UID}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{UID}"
        leaf = {"containerd": CID, "cri-o": f"crio-{CID}", "docker": CID}[runtime]
    return f"{pod}/{leaf}"


def lines_for(path: str, version: str) -> list[str]:
    v1 = [f"{i + 1}:{c}:{path}" for i, c in enumerate(reversed(V1_CONTROLLERS))]
    if version == "v1":
        return v1
    if version == "v2":
        return [f"0::{path}"]
    return [*v1, "0::/"]  # hybrid: the unified hierarchy unused, as on this machine


KUBE_CASES = list(
    itertools.product(
        ("containerd", "cri-o"),
        ("systemd", "cgroupfs"),
        ("v1", "v2", "hybrid"),
        ("guaranteed", "burstable", "besteffort"),
    )
)


@pytest.mark.parametrize("runtime,driver,version,qos", KUBE_CASES)
def test_kubernetes_matrix(runtime, driver, version, qos):
    ref = parse_cgroup_lines(lines_for(kube_path(runtime, driver, qos), version))
    assert ref is not None
    assert (ref.runtime, ref.container_id, ref.pod_uid, ref.qos) == (runtime, CID, UID, qos)
    assert (ref.cgroup_version, ref.driver) == (version, driver)


@pytest.mark.parametrize("qos", ("guaranteed", "burstable", "besteffort"))
@pytest.mark.parametrize("version", ("v1", "v2", "hybrid"))
def test_dockershim_systemd(qos, version):
    ref = parse_cgroup_lines(lines_for(kube_path("docker", "systemd", qos), version))
    assert (ref.runtime, ref.container_id, ref.pod_uid, ref.qos, ref.driver) == ("docker", CID, UID, qos, "systemd")


def test_hybrid_with_the_same_path_on_the_unified_line():
    path = kube_path("containerd", "systemd", "burstable")
    ref = parse_cgroup_lines([*lines_for(path, "v1"), f"0::{path}"])
    assert ref.cgroup_version == "hybrid" and ref.container_id == CID and ref.qos == "burstable"


def test_verbatim_cgroupfs_besteffort_line():
    # container-info's fixture (a GKE node, cgroup v1, cgroupfs).
    line = (
        "11:devices:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/"
        "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"
    )
    ref = parse_cgroup_lines([line])
    assert ref.container_id == "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"
    assert (ref.pod_uid, ref.qos, ref.runtime, ref.driver) == (UID, "besteffort", "containerd", "cgroupfs")
    assert ref.short_id == "34dc0b5e626f2"


def test_kind_nested_kubelet_root():
    # kind / kubelet with --cgroup-root=/kubelet: every slice gets a "kubelet-" prefix.
    u = UID.replace("-", "_")
    line = (
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope"
    )
    ref = parse_cgroup_lines([line])
    assert (ref.pod_uid, ref.qos, ref.container_id) == (UID, "besteffort", CID)
    line = f"0::/kubelet/kubepods/burstable/pod{UID}/{CID}"
    assert parse_cgroup_lines([line]).qos == "burstable"


INNER_UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
INNER_CID = "c" * 64
NESTED = {
    # k3s / kind (cgroupfs) inside a GPU pod: the inner kubelet's tree below the outer container.
    "cgroupfs": f"/kubepods/burstable/pod{UID}/{CID}/kubepods/besteffort/pod{INNER_UID}/{INNER_CID}",
    # the same with the systemd driver, outside and inside (kind's "kubelet-" prefix).
    "systemd": (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{INNER_UID.replace('-', '_')}.slice/cri-containerd-{INNER_CID}.scope"
    ),
}


@pytest.mark.parametrize("version", ("v1", "v2", "hybrid"))
@pytest.mark.parametrize("driver", sorted(NESTED))
def test_a_nested_kubepods_tree_is_the_outer_pods(driver, version):
    """Issue 29: the uid came from the deepest pod, the container from the outermost, so a process
    of a running GPU pod running kind or k3s was named after (and judged by) the inner pod."""
    ref = parse_cgroup_lines(lines_for(NESTED[driver], version))
    assert (ref.pod_uid, ref.container_id, ref.qos, ref.runtime) == (UID, CID, "burstable", "containerd")
    inner_pod_level = NESTED[driver].rsplit("/", 1)[0]  # a process in the inner pod's own cgroup
    assert (parse_cgroup_path(inner_pod_level).pod_uid, parse_cgroup_path(inner_pod_level).container_id) == (UID, CID)


def test_a_kubepods_tree_inside_a_docker_container_is_that_containers():
    """A kind node is a docker container: the pods of its own kubelet are no pods of this node's."""
    line = f"0::/system.slice/docker-{CID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{INNER_UID.replace('-', '_')}.slice/cri-containerd-{INNER_CID}.scope"
    ref = parse_cgroup_lines([line])
    assert (ref.runtime, ref.container_id, ref.pod_uid) == ("docker", CID, None)


def test_static_pod_uid_is_a_hash():
    line = f"0::/kubepods/burstable/pod6a9f5c9e9b4f4b3d8d3e1f2a3b4c5d6e/{CID}"
    assert parse_cgroup_lines([line]).pod_uid == "6a9f5c9e9b4f4b3d8d3e1f2a3b4c5d6e"


def test_cgroup_v2_sub_cgroup_below_the_container():
    # CRI-O and podman may put the workload one level below the scope (".../container", "init").
    u = UID.replace("-", "_")
    line = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-{CID}.scope/container"
    ref = parse_cgroup_lines([line])
    assert (ref.runtime, ref.container_id, ref.qos) == ("cri-o", CID, "burstable")


def test_pod_cgroup_without_a_container():
    u = UID.replace("-", "_")
    ref = parse_cgroup_lines([f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"])
    assert (ref.container_id, ref.runtime, ref.pod_uid, ref.qos) == (None, None, UID, "besteffort")


@pytest.mark.parametrize("version", ("v1", "v2", "hybrid"))
@pytest.mark.parametrize(
    "path,runtime,driver",
    [
        (f"/docker/{CID}", "docker", "cgroupfs"),
        (f"/system.slice/docker-{CID}.scope", "docker", "systemd"),
        (f"/machine.slice/libpod-{CID}.scope", "podman", "systemd"),
        (f"/libpod_parent/libpod-{CID}", "podman", "cgroupfs"),
        (f"/machine.slice/machine-libpod_pod_0123abcd.slice/libpod-{CID}.scope", "podman", "systemd"),
        (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope", "podman", "systemd"),
        (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container", "podman", "systemd"),
    ],
)
def test_docker_and_podman(path, runtime, driver, version):
    ref = parse_cgroup_lines(lines_for(path, version))
    assert (ref.runtime, ref.container_id, ref.driver, ref.cgroup_version) == (runtime, CID, driver, version)
    assert ref.pod_uid is None and ref.qos is None


def test_verbatim_docker_lines():
    # neuvector's docker fixtures: CentOS (systemd) and Debian (cgroupfs, no /docker parent).
    centos = [f"10:devices:/system.slice/docker-{CID}.scope", f"2:cpuacct,cpu:/system.slice/docker-{CID}.scope"]
    assert parse_cgroup_lines(centos).runtime == "docker"
    debian_id = "4f797c539e6c745de61a93ca3ff892358ecbcaccd8414d5db545c38428142970"
    ref = parse_cgroup_lines([f"4:memory:/{debian_id}", f"2:cpu:/{debian_id}"])
    assert (ref.container_id, ref.runtime) == (debian_id, "unknown")


def test_podman_cgroupfs_as_seen_on_this_machine():
    lines = [
        f"9:name=systemd:/libpod_parent/libpod-{CID}",
        f"4:memory:/libpod_parent/libpod-{CID}",
        f"0::/libpod_parent/libpod-{CID}",
    ]
    ref = parse_cgroup_lines(lines)
    assert (ref.runtime, ref.container_id, ref.driver, ref.cgroup_version) == ("podman", CID, "cgroupfs", "hybrid")


@pytest.mark.parametrize(
    "lines",
    [
        ["0::/init.scope"],
        ["0::/system.slice/kubelet.service"],
        ["0::/system.slice/containerd.service"],
        ["1:name=systemd:/user.slice/user-0.slice/session-3.scope", "0::/user.slice/user-0.slice/session-3.scope"],
        ["0::/"],
        ["0::/../.."],  # a reader in another cgroup namespace
        ["0::/../../.."],
        [
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope"
        ],
        [f"0::/machine.slice/libpod-conmon-{CID}.scope"],
        ["4:memory:/process_api/1b50ee123f7bbfd625eaf8e4717bd0dd", "0::/"],  # this sandbox: 32 hex, not a container
        [f"0::/somewhere/pod{UID}/notanid"],  # "pod<uid>" outside kubepods is nobody's pod
        [],
        ["garbage"],
    ],
)
def test_negatives(lines):
    assert parse_cgroup_lines(lines) is None


def test_other_cgroup_namespace_relative_path_still_names_the_container():
    assert parse_cgroup_lines([f"0::/../../docker-{CID}.scope"]).container_id == CID


def test_cgroup_version_and_cache():
    assert cgroup_version(["0::/"]) == "v2"
    assert cgroup_version(["1:cpu:/"]) == "v1"
    assert cgroup_version(["1:cpu:/", "0::/"]) == "hybrid"
    assert cgroup_version([]) is None
    assert parse_cgroup_path(f"/docker/{CID}") is parse_cgroup_path(f"/docker/{CID}")
