"""What a cluster needs before it admits the agent, rendered by a real helm: the CRI socket by runtime
preset (a CRI-O node has no containerd socket), an empty priority class, and NOTES that say the
namespace must be Pod Security `privileged` (issue 18: GKE and CRI-O refused the defaults silently)."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import CHART, DOCS, by_kind, helm, render

SOCKETS = {
    "containerd": "/run/containerd/containerd.sock",
    "crio": "/run/crio/crio.sock",
    "docker": "/var/run/cri-dockerd.sock",
}


def sockets_used(ds: dict) -> set[str]:
    """Every place the DaemonSet names the CRI socket: the argument, the mount and the hostPath."""
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = container["args"]
    used = {args[args.index("--cri-socket") + 1]}
    used |= {m["mountPath"] for m in container["volumeMounts"] if m["name"] == "cri-socket"}
    used |= {v["hostPath"]["path"] for v in spec["volumes"] if v["name"] == "cri-socket"}
    return used


@pytest.mark.parametrize("runtime", list(SOCKETS))
def test_the_runtime_preset_picks_its_socket(helm_binary, runtime):
    ds = by_kind(render(helm_binary, {"exporter": {"cri": {"runtime": runtime}}}))["DaemonSet"]
    assert sockets_used(ds) == {SOCKETS[runtime]}


def test_a_socket_path_wins_over_the_preset(helm_binary):
    k3s = "/run/k3s/containerd/containerd.sock"
    ds = by_kind(render(helm_binary, {"exporter": {"cri": {"runtime": "crio", "socket": k3s}}}))["DaemonSet"]
    assert sockets_used(ds) == {k3s}


def test_the_default_is_containerd(helm_binary):
    assert sockets_used(by_kind(render(helm_binary))["DaemonSet"]) == {SOCKETS["containerd"]}


def test_an_unknown_runtime_is_refused_by_the_schema(helm_binary):
    got = helm(helm_binary, "template", "gpuzombie", str(CHART), values={"exporter": {"cri": {"runtime": "rkt"}}})
    assert got.returncode != 0 and "runtime" in got.stderr


def test_an_empty_priority_class_leaves_it_out(helm_binary):
    spec = by_kind(render(helm_binary, {"priorityClassName": ""}))["DaemonSet"]["spec"]["template"]["spec"]
    assert "priorityClassName" not in spec


def test_notes_and_docs_say_what_the_namespace_needs(helm_binary):
    got = helm(helm_binary, "install", "gpuzombie", str(CHART), "--dry-run", "--namespace", "monitoring")
    assert got.returncode == 0, got.stderr
    notes = got.stdout[got.stdout.index("NOTES:") :]
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    assert "ResourceQuota" in notes and "--set priorityClassName=" in notes
    assert "exporter.cri.runtime=crio" in notes
    docs = DOCS.read_text()
    assert "pod-security.kubernetes.io/enforce=privileged" in docs and "scopeName: PriorityClass" in docs
    assert "`crio`" in docs and "/run/crio/crio.sock" in docs
