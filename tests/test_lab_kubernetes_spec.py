"""The kubernetes runtime's pure parts: the Pod object a scenario becomes, the changes the lab makes
to a manifest for the cluster's node (each said), and what it reads back from the node's logs (the
kubelet's signals as containerd logs them, a failed hook as the kubelet logs it). The runs on the
real cluster are tests/kube/test_lab_kubernetes.py."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="the kubernetes runtime asks the node's containerd over CRI: the 'node' extra")

from gpuzombie.cli.lab import run_command
from gpuzombie.errors import GpuzombieError
from gpuzombie.lab.labrun import LabConfig
from gpuzombie.lab.manifest import parse_pod
from gpuzombie.lab.runner import LabRequest, check_request
from gpuzombie.lab.runtime.kube import _epoch, hook_failure, stop_signals
from gpuzombie.lab.runtime.kubespec import (
    HOOK_OUT_MOUNT,
    LAB_LABEL,
    HostMount,
    NodeParts,
    capture_prestop,
    node_document,
    scenario_document,
)
from gpuzombie.lab.scenarios import SCENARIOS, scenario_manifest

IMAGE = "localhost/gpuzombie/busybox:static"
PARTS = NodeParts(
    image=IMAGE,
    mounts=(
        HostMount("/usr"),
        HostMount("/etc/ld.so.cache", is_file=True),
        HostMount("/x/prestop.pyz", True, "/opt/gpuzombie/prestop.pyz"),
    ),
    env={"PATH": "/bin:/venv/bin", "PYTHONPATH": "/src"},
)
CID = "16b7fa9b010a8099f4350722c68780ef85cce789174743c1708cfb13720a78d7"
CONTAINERD_LOG = f"""\
time="2026-12-03T13:43:56.730751744Z" level=info msg="StopContainer for \\"{CID}\\" with timeout 3 (s)"
time="2026-12-03T13:43:56.731342656Z" level=info msg="Stop container \\"{CID}\\" with signal terminated"
time="2026-12-03T13:43:59.742599712Z" level=info msg="Kill container \\"{CID}\\""
time="2026-12-03T13:43:59.847380152Z" level=info msg="StopContainer for \\"{CID}\\" returns successfully"
"""
"""containerd 1.6.20's own lines for a container that ignored SIGTERM (grace 3 s), as the cluster logged them."""
KUBELET_LOG = (
    'E1203 14:07:40.541939   29964 kuberuntime_container.go:794] "PreStop hook failed" '
    'err="command \'gpuzombie prestop --timeout 20\' exited with 137: " pod="gpu-zombie-test/gpu-zombie-tini-prestop" '
    f'podUID="b76b9119" containerName="worker" containerID="containerd://{CID}"\n'
)


def scenario(name: str, grace: float = 2) -> dict:
    config = LabConfig(grace=grace, size_mib=32)
    s = SCENARIOS[name]
    init = "sleep" if s.init == "sleep" else "tini"
    manifest = scenario_manifest(
        s, config, init, ["sleep", "infinity"], image=IMAGE, namespace="gpuzombie-lab", zipapp="/opt/x.pyz"
    )
    return scenario_document(manifest, name=f"{name}-1")


def test_a_scenario_is_the_pod_a_person_would_write():
    doc = scenario("s3-tini-prestop")
    assert doc["metadata"] == {"name": "s3-tini-prestop-1", "namespace": "gpuzombie-lab"}
    spec = doc["spec"]
    assert spec["terminationGracePeriodSeconds"] == 2 and spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert container["command"][1:4] == ["-s", "--", "sh"]  # tini -s -- sh -c ...
    assert "gpuzombie.prestop" in container["lifecycle"]["preStop"]["exec"]["command"]
    assert "shareProcessNamespace" not in spec
    assert scenario("s5-sharepid")["spec"]["shareProcessNamespace"] is True
    assert "lifecycle" not in scenario("s1-nofix")["spec"]["containers"][0]


def test_the_node_document_says_each_change_and_leaves_the_manifest_alone():
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "g-", "labels": {"app": "a"}},
        "spec": {
            "imagePullSecrets": [{"name": "s"}],
            "volumes": [{"name": "data", "hostPath": {"path": "/srv"}}],
            "containers": [
                {
                    "name": "w",
                    "image": "registry.example.com/w:1",
                    "imagePullPolicy": "Always",
                    "args": ["sleep", "1"],
                    "env": [{"name": "PATH", "value": "/mine"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "1Gi"}},
                    "securityContext": {"capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }
    before = copy.deepcopy(manifest)
    doc, changes = node_document(
        manifest, PARTS, name="p", namespace="ns", grace=5, run_label="run-1", read_only_volumes=["data"]
    )
    assert manifest == before
    assert "status" not in doc and "generateName" not in doc["metadata"]
    assert doc["metadata"]["name"] == "p" and doc["metadata"]["namespace"] == "ns"
    assert doc["metadata"]["labels"] == {"app": "a", LAB_LABEL: "run-1"}
    assert doc["spec"]["imagePullSecrets"] == [{"name": "s"}]  # untouched: a node that pulls nothing ignores it
    assert doc["spec"]["terminationGracePeriodSeconds"] == 5
    (c,) = doc["spec"]["containers"]
    assert (c["image"], c["imagePullPolicy"]) == (IMAGE, "Never")
    assert c["env"][0] == {"name": "PYTHONPATH", "value": "/src"} and {"name": "PATH", "value": "/mine"} in c["env"]
    assert not any(e == {"name": "PATH", "value": "/bin:/venv/bin"} for e in c["env"])  # the manifest's wins
    assert c["resources"] == {"limits": {"memory": "1Gi"}}
    assert c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL", "NET_RAW"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True
    assert mounts["/opt/gpuzombie/prestop.pyz"]["readOnly"] is True
    volumes = {v["name"]: v for v in doc["spec"]["volumes"]}
    by_path = {v["hostPath"]["path"]: v["hostPath"] for v in volumes.values()}
    assert by_path["/etc/ld.so.cache"] == {"path": "/etc/ld.so.cache", "type": "File"}
    assert by_path["/usr"] == {"path": "/usr"}
    said = " | ".join(changes)
    for words in (
        "imagePullPolicy: Never",
        "terminationGracePeriodSeconds: 5",
        "nvidia.com/gpu",
        "RuntimeDefault",
        "NET_RAW",
        "data mounted read-only",
        "/x/prestop.pyz at /opt/gpuzombie/prestop.pyz",
    ):
        assert words in said, words
    json.dumps(doc)  # what kubectl apply reads


def test_a_scenarios_hook_keeps_its_output_in_a_directory_of_the_run(tmp_path: Path):
    doc, changes = node_document(
        scenario("s4-fullfix"),
        PARTS,
        name="s4",
        namespace="gpuzombie-lab",
        grace=None,
        run_label="r",
        hook_out=str(tmp_path),
    )
    (c,) = doc["spec"]["containers"]
    hook = c["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["sh", "-c"] and hook[3] == "prestop"
    assert (
        "gpuzombie.prestop" in hook[4:]
        and hook[4:] == scenario("s4-fullfix")["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    )
    assert {"name": "gpuzombie-lab-hook", "mountPath": HOOK_OUT_MOUNT} in c["volumeMounts"]
    assert {"name": "gpuzombie-lab-hook", "hostPath": {"path": str(tmp_path), "type": "Directory"}} in doc["spec"][
        "volumes"
    ]
    assert any("sh -c" in words for words in changes)
    assert doc["spec"]["terminationGracePeriodSeconds"] == 2  # grace None: the scenario's own


def test_the_hook_wrapper_keeps_stdout_stderr_and_the_exit_code(tmp_path: Path):
    import subprocess

    argv = capture_prestop(["sh", "-c", "echo out; echo err >&2; exit 3"])
    script = argv[2].replace(HOOK_OUT_MOUNT, str(tmp_path))
    done = subprocess.run([*argv[:2], script, *argv[3:]], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 3
    assert [(tmp_path / n).read_text() for n in ("stdout", "stderr", "rc")] == ["out\n", "err\n", "3\n"]


def test_the_kubelets_signals_are_read_from_the_nodes_containerd_log():
    term, kill = stop_signals(CONTAINERD_LOG, CID)
    assert term == pytest.approx(_epoch("2026-12-03T13:43:56.731342656Z"))
    assert kill is not None and term is not None and kill - term == pytest.approx(3.011257, abs=1e-6)
    assert stop_signals(CONTAINERD_LOG, "0" * 64) == (None, None)
    assert stop_signals(CONTAINERD_LOG.splitlines()[1], CID)[1] is None  # exited on SIGTERM: no kill line


def test_a_failed_hook_is_read_from_the_kubelets_log():
    assert hook_failure(KUBELET_LOG, CID) == (137, "")
    assert hook_failure(KUBELET_LOG, "0" * 64) is None


def test_what_kubernetes_cannot_do_is_one_line_before_anything_starts(tmp_path: Path):
    def request(grace: float = 2.0, uid: int | None = None, device: str = "auto") -> LabRequest:
        config = LabConfig(grace=grace, uid=uid)
        return LabRequest(["s1-nofix"], config, tmp_path, [], device=device, runtimes=("kubernetes",))

    check_request(request())
    for kw, words in (
        ({"grace": 2.5}, "whole seconds"),
        ({"uid": 1000}, "--uid"),
    ):
        with pytest.raises(GpuzombieError, match=words):
            check_request(request(**kw))


@pytest.mark.skipif(os.geteuid() != 0, reason="the kubernetes runtime's first refusal is for non-root")
def test_a_gpu_run_without_a_cluster_and_its_device_plugin_is_refused_in_one_line(tmp_path: Path, monkeypatch):
    """On a GPU the kubelet must allocate the GPU (issue 37): with no cluster up, the run says what to
    start instead of starting a node without a device plugin."""
    pytest.importorskip("cryptography")
    from gpuzombie.lab.runtime.kube import KubeError, kube_runtime

    monkeypatch.setenv("GPUZOMBIE_CLUSTER_DIR", str(tmp_path / "cluster"))
    with (
        pytest.raises(KubeError, match=r"device plugin that advertises nvidia\.com/gpu"),
        kube_runtime(progress=lambda line: None, gpu=True),
    ):
        pass


def test_runtime_all_is_the_three_and_the_help_says_which_cluster():
    from click.testing import CliRunner

    help_text = " ".join(CliRunner().invoke(run_command, ["--help"]).output.split())
    assert "kubernetes" in help_text and "$GPUZOMBIE_CLUSTER_DIR" in help_text
    assert "stops it at the end" in help_text and "leaves it up" in help_text
    ctx = run_command.make_context("run", ["--runtime", "all"])
    assert ctx.params["runtime"] == "all"


def test_a_lab_pod_manifest_parses_for_kubernetes_as_for_containerd():
    """lab pod reads the manifest strictly on both runtimes (one reader, the same refusals)."""
    import yaml

    doc = yaml.safe_load((Path(__file__).parents[1] / "deploy" / "pod-nofix.yaml").read_text())
    parsed = parse_pod(doc)
    out, _ = node_document(doc, PARTS, name=parsed.name, namespace=parsed.namespace, grace=None, run_label="r")
    assert out["spec"]["containers"][0]["args"] == doc["spec"]["containers"][0]["args"]  # unpatched: the same argv
